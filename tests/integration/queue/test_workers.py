"""The GPU handoff queue with real worker processes on a real broker (no eager mode)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.sandbox import cgroups
from app.sandbox.exceptions import SandboxUnavailable
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import alive, wait_for

FINISHED = ("succeeded", "failed", "cancelled")


def submit(stores: Stores, workers: Workers, repo: Path, **params: object) -> int:
    settings = workers.settings
    with stores.ops_session() as session:
        project = (
            ops.get_project(session, repo.name)
            if _exists(session, repo.name)
            else ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        )
        cfg = project_config.load(repo)
        job_id = jobs.submit(session, settings, project, cfg, "probe", dict(params)).id
    broker.ring_gpu(settings, "gpu.cpu")
    return job_id


def _exists(session, name):  # type: ignore[no-untyped-def]
    from app.projects import repository

    return repository.get_project(session, name) is not None


def job(stores: Stores, job_id: int) -> Job:
    with stores.ops_session() as session:
        row = session.get(Job, job_id)
        assert row is not None
        session.expunge(row)
        return row


def finished(stores: Stores, job_id: int) -> Job | None:
    row = job(stores, job_id)
    return row if row.state in FINISHED else None


def runs(workers: Workers, job_id: int) -> list[str]:
    path = workers.settings.state_dir.absolute() / "jobs" / str(job_id) / "runs.txt"
    return path.read_text().split() if path.exists() else []


def has_cgroups() -> bool:
    try:
        cgroups.Cgroup.create(f"probe-queue-{os.getpid()}").remove()
    except SandboxUnavailable:
        return False
    return True


def stub_cgroups(worker_pid: int) -> list[Path]:
    """The exec stubs' cgroups of a worker (`workers/launcher/execstub.py`)."""
    return sorted(cgroups.cgroup_base().glob(f"stub-*.w{worker_pid}"))


def test_job_end_to_end(workers: Workers, stores: Stores, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "probe-a")
    workers.start("control", "control", "--beat")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    job_id = submit(stores, workers, repo, sleep_s=0.05)
    done = wait_for(lambda: finished(stores, job_id), timeout=120)
    assert done.state == "succeeded", (done.error, workers.logs())
    assert done.result is not None
    assert {k: done.result[k] for k in ("status", "experiment", "parameters", "sandbox")} == {
        "status": "ok",
        "experiment": "probe",
        "parameters": {"sleep_s": 0.05, "grandchild": 0},
        "sandbox": "off",  # the worker's record, not the job's
    }
    assert done.result["comparisons"][0]["samples"]["a_ns"]  # the raw report, kept as it came
    log_text = Path(done.log_path or "").read_text()
    # The run's first line, after its preparation's (a venv build's progress, when it built one)
    ran = [line for line in log_text.splitlines() if not line.startswith("[venv] ")]
    assert ran[0] == "[sandbox] off: untrusted code ran unconfined (AUTOPILOT_SANDBOX=off)"
    assert done.attempts == 1 and done.first_line_at is not None
    if has_cgroups():  # its first job was exec'd by the stub the worker readied at its start
        stub = "[launch] started cold by the worker's exec stub, in cgroup stub-"
        assert any(line.startswith(stub) for line in ran), ran
    assert len(runs(workers, job_id)) == 1
    with stores.ops_session() as session:
        (worker,) = jobs.list_workers(session)
        assert worker.kind == "cpu" and worker.current_job_id is None


@pytest.mark.stores("sqlite", "postgres")  # a killed worker's message is redelivered by Redis
def test_sigkill_mid_job_completes_exactly_once(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-k")
    workers.start("control", "control", "--beat")
    for round_ in range(2):
        workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
        job_id = submit(stores, workers, repo, sleep_s=3)
        wait_for(lambda: job(stores, job_id).state == "running", timeout=120)
        first_pid = wait_for(lambda: runs(workers, job_id))[0]
        workers.kill("gpu")
        # The experiment dies with its worker (PR_SET_PDEATHSIG): no orphan keeps the GPU.
        wait_for(lambda: not Path(f"/proc/{first_pid}").exists(), timeout=10)
        workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
        done = wait_for(lambda: finished(stores, job_id), timeout=120)
        assert done.state == "succeeded", (round_, done.error, workers.logs())
        # Killed at least once, then completed once; a slow heartbeat on a loaded machine may
        # cost an extra attempt, but every attempt is a recorded lease and one outcome stands.
        assert done.attempts >= 2
        assert len(runs(workers, job_id)) == done.attempts
        workers.kill("gpu")
    with stores.ops_session() as session:
        assert all(j.state == "succeeded" for j in jobs.list_jobs(session))


def test_duplicate_doorbells_are_no_ops(workers: Workers, stores: Stores, tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "probe-d")
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    job_id = submit(stores, workers, repo, sleep_s=0.2)
    for _ in range(3):
        broker.ring_gpu(workers.settings, "gpu.cpu")
        broker.ring_gpu(workers.settings, "gpu.cpu")
    done = wait_for(lambda: finished(stores, job_id), timeout=120)
    assert done.state == "succeeded"
    # A later job proves the duplicate doorbells were all consumed without running anything.
    later = submit(stores, workers, repo, sleep_s=0.05)
    wait_for(lambda: finished(stores, later), timeout=120)
    assert len(runs(workers, job_id)) == 1
    assert job(stores, job_id).attempts == 1


def test_cancel_running_job_kills_its_tree(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-c")
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    job_id = submit(stores, workers, repo, sleep_s=60, grandchild=1)
    pid_file = workers.settings.state_dir.absolute() / "jobs" / str(job_id) / "grandchild.pid"
    grandchild = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), timeout=120))
    with stores.ops_session() as session:
        jobs.cancel(session, job_id, by="alice")
    done = wait_for(lambda: finished(stores, job_id), timeout=60)
    assert done.state == "cancelled" and done.cancelled_by == "alice"
    wait_for(lambda: not alive(grandchild), timeout=10)


def parked_interpreters(parent: int) -> list[int]:
    """Pids of the parked interpreters (`runner.Spare`) whose parent is `parent`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if b"_autopilot_park" in cmdline and int(fields[1]) == parent and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def test_the_next_job_runs_in_the_interpreter_parked_for_it(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-p")
    workers.start("control", "control")
    gpu = workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    first = submit(stores, workers, repo, sleep_s=3)
    wait_for(lambda: runs(workers, first), timeout=120)
    # The first job's user code has started: the worker parks an interpreter for the next one.
    (parked,) = wait_for(lambda: parked_interpreters(gpu.pid), timeout=30)
    second = submit(stores, workers, repo, sleep_s=0.05)
    done = wait_for(lambda: finished(stores, second), timeout=120)
    assert done.state == "succeeded", (done.error, workers.logs())
    assert runs(workers, second) == [str(parked)]  # it ran in that very process
    log_text = Path(done.log_path or "").read_text()
    assert "[launch] handed to the parked interpreter" in log_text
    assert finished(stores, first) is not None
    # The second job parked the next one in turn; it dies with its worker (PR_SET_PDEATHSIG).
    (again,) = wait_for(lambda: parked_interpreters(gpu.pid), timeout=30)
    assert again != parked
    # A stub waits in a cgroup of the worker for a later cold start: it dies with its worker.
    stubs = stub_cgroups(gpu.pid) if has_cgroups() else []
    assert stubs or not has_cgroups()
    workers.kill("gpu")
    wait_for(lambda: not Path(f"/proc/{again}").exists(), timeout=10)
    wait_for(lambda: not any(path.exists() for path in stubs), timeout=10)


def test_the_next_job_is_reserved_while_one_runs_and_each_runs_once(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-r")
    workers.start("control", "control")
    # every job this host has ready is reserved at once (one worker: no idle GPU to wait for)
    workers.start(
        "gpu", "gpu", "--kind", "cpu", "--device", "0", env={"AUTOPILOT_GPU_RESERVE_AFTER_S": "0"}
    )
    ids = [submit(stores, workers, repo, sleep_s=s) for s in (3, 0.5, 0.5, 0.05)]
    done = [wait_for(lambda i=i: finished(stores, i), timeout=180) for i in ids]
    assert [d.state for d in done] == ["succeeded"] * 4, workers.logs()
    assert [len(runs(workers, i)) for i in ids] == [1, 1, 1, 1]
    assert [d.attempts for d in done] == [1, 1, 1, 1]
    # A job prepared while the one before it ran was reserved at that job's first line and
    # handed over when it ended; its start was recorded with the previous job's outcome.
    reserved = [
        d
        for d in done
        if "[launch] reserved while the previous job ran" in Path(d.log_path or "").read_text()
    ]
    assert reserved, [Path(d.log_path or "").read_text() for d in done]
    for d in reserved:
        before = done[ids.index(d.id) - 1]
        assert before.finished_at is not None and d.first_line_at is not None
        assert d.idle_gap_s is not None and d.idle_gap_s >= 0
    with stores.ops_session() as session:
        from app.jobs.models import Lease

        assert session.query(Lease).count() == 0  # nothing left reserved or leased


@pytest.mark.stores("sqlite", "postgres")  # two workers race for one job under PostgreSQL's locks
def test_an_idle_worker_takes_over_a_busy_workers_reservation_and_it_runs_once(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    """A reservation never keeps a job from an idle GPU (app/jobs/service.py, lease_next):
    the second worker takes the job the first reserved behind its long one; the first one's
    staged start never runs it."""
    from workers import prepare

    repo = make_repo(tmp_path, "probe-t")
    workers.start("control", "control")
    workers.start_api()
    long_job = submit(stores, workers, repo, sleep_s=60)
    nxt = submit(stores, workers, repo, sleep_s=0.05)
    # both ready on this host before a worker starts: the first one to start reserves `nxt`
    # at its long job's first line (no other worker of the host is idle then)
    assert prepare.prepare_ahead(stores, workers.settings, "gpu.cpu", want=2, ring=False) == 2
    env = {"AUTOPILOT_GPU_RESERVE_AFTER_S": "0"}
    workers.start("gpu0", "gpu", "--kind", "cpu", "--device", "0", env=env)
    busy = wait_for(lambda: job(stores, long_job).worker, timeout=120)

    def reserver() -> str | None:
        from app.jobs import repository as repo_rows

        with stores.ops_session() as session:
            lease = repo_rows.lease_of(session, nxt)
            return lease.worker if lease is not None else None

    reserved = wait_for(reserver, timeout=60)
    assert reserved == busy and job(stores, nxt).state == "reserved"
    workers.start("gpu1", "gpu", "--kind", "cpu", "--device", "1", env=env)
    done = wait_for(lambda: finished(stores, nxt), timeout=120)
    assert done.state == "succeeded", (done.error, workers.logs())
    assert done.worker not in (None, busy) and done.attempts == 1
    assert len(runs(workers, nxt)) == 1
    # the long job was never disturbed; cancelled, it leaves nothing leased or reserved
    assert job(stores, long_job).state == "running"
    with stores.ops_session() as session:
        jobs.cancel(session, long_job, "test")
    assert wait_for(lambda: finished(stores, long_job), timeout=60).state == "cancelled"
    assert len(runs(workers, nxt)) == 1

    def leases() -> int:
        from app.jobs.models import Lease

        with stores.ops_session() as session:
            return session.query(Lease).count()

    wait_for(lambda: leases() == 0, timeout=30)


@pytest.mark.stores("sqlite", "postgres")  # two workers race for one job under PostgreSQL's locks
def test_a_reserver_whose_job_ends_right_after_a_takeover_never_starts_the_job(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    """The race of a takeover: the reserver's job ends before any renewal could tell it (its
    heartbeat is slow here), with the reserved job staged on its parked interpreter. It makes
    the reservation its own first (`reservations.confirm`), finds it taken, and starts nothing."""
    import os
    import signal

    from app.jobs import repository as repo_rows
    from workers import prepare

    def holder(job_id: int) -> tuple[str, int | None] | None:
        with stores.ops_session() as session:
            lease = repo_rows.lease_of(session, job_id)
            return (lease.worker, lease.pgid) if lease is not None else None

    repo = make_repo(tmp_path, "probe-r")
    workers.start("control", "control")
    workers.start_api()
    long_job = submit(stores, workers, repo, sleep_s=60)
    nxt = submit(stores, workers, repo, sleep_s=3)
    assert prepare.prepare_ahead(stores, workers.settings, "gpu.cpu", want=2, ring=False) == 2
    slow = {
        "AUTOPILOT_GPU_RESERVE_AFTER_S": "0",
        "AUTOPILOT_HEARTBEAT_INTERVAL_S": "60",
        "AUTOPILOT_LEASE_TTL_S": "180",
    }
    workers.start("gpu0", "gpu", "--kind", "cpu", "--device", "0", env=slow)
    busy = wait_for(lambda: job(stores, long_job).worker, timeout=120)
    assert wait_for(lambda: holder(nxt), timeout=60)[0] == busy  # reserved at its first line
    workers.start("gpu1", "gpu", "--kind", "cpu", "--device", "1")
    taker = wait_for(lambda: (h := holder(nxt)) is not None and h[0] != busy and h[0], timeout=120)
    wait_for(lambda: len(runs(workers, nxt)) == 1, timeout=60)  # running on the taker
    held = holder(long_job)
    assert held is not None and held[0] == busy and held[1] is not None
    os.killpg(held[1], signal.SIGKILL)  # the reserver's job ends now
    # its end is handled (the staged start, if any, came first) once it no longer runs there
    wait_for(lambda: job(stores, long_job).state != "running", timeout=60)
    done = wait_for(lambda: finished(stores, nxt), timeout=120)
    assert done.state == "succeeded", (done.error, workers.logs())
    assert (done.worker, done.attempts) == (taker, 1)
    assert len(runs(workers, nxt)) == 1, workers.logs()
