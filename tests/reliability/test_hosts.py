"""GPU hosts that share nothing with the control host, on one machine (docs/design.md, "Hosts
and boundaries"): each GPU worker runs in its own UTS and mount namespace (its own hostname; the
control host's state dir and the project's repository hidden under an empty tmpfs), with its own
state dir and only a GPU host's settings. Code reaches it through the API's git endpoint,
results go back through the ops DB.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.api.main import create_app
from app.db import Stores
from app.jobs.models import Job, Lease, Worker
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers, make_repo
from tests.reliability.conftest import job_rows, leases_of, need_tools, skip_or_fail
from tests.support import alive, bearer, wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(240),
]

HOSTS = ("gpu-host-a", "gpu-host-b")
CYCLES = 20
ENDED = ("awaiting_review", "failed", "skipped_repeat", "cancelled")
#: What a GPU host's environment holds of our settings (issue 14, point 6, and test speed-ups).
HOST_SETTINGS = {
    "AUTOPILOT_BROKER_URL",
    "AUTOPILOT_OPS_URL",
    "AUTOPILOT_CONTROL_URL",
    "AUTOPILOT_CONTROL_TOKEN",
    "AUTOPILOT_STATE_DIR",
    "AUTOPILOT_VENV_ROOT",
    "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES",
    "AUTOPILOT_LEASE_TTL_S",
    "AUTOPILOT_HEARTBEAT_INTERVAL_S",
    "AUTOPILOT_SANDBOX",  # set by the test fixtures (queue_sandbox); no secret
}


def need_namespaces() -> None:
    need_tools("unshare", "mount", "hostname")
    if os.geteuid() != 0:
        skip_or_fail("GPU hosts in their own mount and UTS namespaces need root (unshare)")


def need_shared_nothing(backend: Backend, workers: Workers) -> None:
    if backend.name != "postgres" or not workers.settings.broker_url.startswith("redis"):
        pytest.skip(
            "GPU hosts share only the broker and the ops DB with the control host: the embedded "
            "SQLite stores and filesystem broker live in the control's state dir, hidden from them"
        )


def test_a_gpu_host_sees_none_of_the_control_hosts_files(tmp_path: Path) -> None:
    """The namespace prologue itself: another hostname, the control's state dir empty, and
    nothing of it leaks back to the control host."""
    need_namespaces()
    control_state = tmp_path / "state"
    (control_state / "forge").mkdir(parents=True)
    (control_state / "ops.db").write_text("control host's file")
    argv = Workers.host_argv(
        "gpu-host-a",
        [control_state],
        ["sh", "-c", f'hostname; ls -A "{control_state}"; touch "{control_state}/from-host"'],
    )
    inside = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.split() == ["gpu-host-a"], inside.stdout  # hostname, then nothing
    assert os.uname().nodename != "gpu-host-a"
    assert sorted(p.name for p in control_state.iterdir()) == ["forge", "ops.db"]


def _start_hosts(workers: Workers, tmp_path: Path, hidden: list[Path]) -> dict[str, Path]:
    """Both GPU hosts, each with its own state dir; {hostname: state dir}."""
    state_dirs = {}
    for host in HOSTS:
        state_dirs[host] = tmp_path / host
        workers.start_gpu_host(host, host, state_dirs[host], hidden)
    return state_dirs


def _registered(stores: Stores) -> dict[str, str] | None:
    """{worker name: host} of the GPU workers, once both hosts' workers registered."""
    with stores.ops_session() as session:
        rows = session.execute(select(Worker.name, Worker.host).where(Worker.kind == "cpu")).all()
    found = dict(rows)
    return found if set(found.values()) == set(HOSTS) else None


def _inside(unshare_pid: int) -> int:
    """The GPU worker's pid: the child unshare forked (the prologue's shell exec'd it)."""
    children = Path(f"/proc/{unshare_pid}/task/{unshare_pid}/children").read_text().split()
    assert children, f"unshare {unshare_pid} has no child"
    return int(children[0])


def _host_env(pid: int) -> set[str]:
    """The AUTOPILOT_ settings in a process's environment."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return {e.split(b"=", 1)[0].decode() for e in raw if e.startswith(b"AUTOPILOT_")}


def _tmpfs_mounts(pid: int) -> set[str]:
    """Mount points of the tmpfs filesystems a process sees (its mount namespace)."""
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return {f.split()[4] for f in lines if f.split(" - ")[1].split()[0] == "tmpfs"}


def _runs(state_dir: Path, job_id: int) -> list[str]:
    """The probe's starts of this job on one host (it appends its pid beside its source)."""
    path = state_dir / "jobs" / str(job_id) / "runs.txt"
    return path.read_text().split() if path.exists() else []


def _host_of(row: Job) -> str:
    return (row.worker or "").rpartition("@")[2]


def _project(stores: Stores, repo: Path) -> str:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    return token


def test_twenty_cycles_over_two_gpu_hosts(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    need_shared_nothing(backend, workers)
    need_namespaces()
    settings = workers.settings.model_copy(update={"max_live_cycles_per_project": 2 * CYCLES})
    repo = make_repo(tmp_path, "hosts-cycles")
    token = _project(stores, repo)
    workers.start("control", "control", "--beat")
    state_dirs = _start_hosts(workers, tmp_path, [settings.state_dir.absolute(), repo])
    wait_for(lambda: _registered(stores), timeout=60)
    for host in HOSTS:  # its own namespaces, and only a GPU host's settings
        pid = _inside(workers.procs[host].pid)
        assert os.readlink(f"/proc/{pid}/ns/uts") != os.readlink("/proc/self/ns/uts")
        assert {str(settings.state_dir.absolute()), str(repo)} <= _tmpfs_mounts(pid)
        assert _host_env(pid) == HOST_SETTINGS

    began = time.monotonic()
    with TestClient(create_app(settings, stores)) as client:
        ids = []
        for i in range(CYCLES):
            made = client.post(
                "/api/v1/cycles",
                headers=bearer(token),
                json={
                    "project": repo.name,
                    "experiment": "probe",
                    "parameters": {"sleep_s": (0.05, 0.2, 0.5)[i % 3], "grandchild": 0},
                    "changed_hypothesis": f"run {i} of the multi-host test",
                },
            )
            assert made.status_code == 201, made.text
            ids.append(made.json()["id"])

        def states() -> dict[int, dict[str, Any]]:
            listed = client.get(
                "/api/v1/cycles", params={"project": repo.name}, headers=bearer(token)
            ).json()
            return {c["id"]: c for c in listed}

        def settled() -> dict[int, dict[str, Any]] | None:
            now = states()
            return now if all(now[i]["state"] in ENDED for i in ids) else None

        try:
            cycles = wait_for(settled, timeout=180, interval=0.5)
        except AssertionError:
            pending = {i: c["state"] for i, c in states().items() if c["state"] not in ENDED}
            raise AssertionError(
                f"cycles not settled: {pending}\n{workers.logs()[-6000:]}"
            ) from None
    wall_s = time.monotonic() - began
    logs = workers.logs()
    assert {c["state"] for c in cycles.values()} == {"awaiting_review"}, (
        {i: (c["state"], c["error"]) for i, c in cycles.items()},
        logs[-6000:],
    )
    job_ids = [cycles[i]["job_id"] for i in ids]
    assert None not in job_ids and len(set(job_ids)) == CYCLES
    rows = job_rows(stores, job_ids)
    by_host: dict[str, int] = {}
    for job_id, row in rows.items():
        host = _host_of(row)
        assert host in HOSTS, (job_id, row.worker, logs[-4000:])
        # Run once, on the host its lease named, from that host's own clean export.
        assert (row.state, row.attempts) == ("succeeded", 1), (job_id, row.state, row.error)
        assert _runs(state_dirs[host], job_id) and len(_runs(state_dirs[host], job_id)) == 1
        assert [h for h in HOSTS if h != host and _runs(state_dirs[h], job_id)] == []
        assert Path(row.workdir or "").is_relative_to(state_dirs[host]), (job_id, row.workdir)
        # Its code came as a commit through the API's git endpoint, not from a path.
        assert (row.repo or "").startswith(settings.control_url), (job_id, row.repo)
        assert row.head_sha and row.base_sha, job_id
        by_host[host] = by_host.get(host, 0) + 1
    assert set(by_host) == set(HOSTS), (by_host, logs[-4000:])
    assert leases_of(stores, job_ids) == []
    # No GPU host exported or ran anything under the control host's state dir: what is there
    # per job is the log the host uploaded through the API, nothing else.
    control_jobs = settings.state_dir / "jobs"
    left = sorted(
        str(p.relative_to(control_jobs))
        for p in control_jobs.glob("*/*")
        if p.name != "job.log" and not p.name.startswith(".")
    )
    assert left == []
    assert {p.parent.name for p in control_jobs.glob("*/job.log")} == {str(j) for j in job_ids}
    figures["hosts_twenty_cycles[postgres-redis]"] = {
        "cycles": CYCLES,
        "awaiting_review": CYCLES,
        "gpu_hosts": len(HOSTS),
        "jobs_by_host": by_host,
        "wall_s": round(wall_s, 1),
    }


def _running_on(stores: Stores, state_dirs: dict[str, Path], job_id: int) -> tuple[str, int] | None:
    """(host, experiment pid) once the job's experiment runs under a lease; else falsy."""
    with stores.ops_session() as session:
        found = session.execute(
            select(Job.state, Lease.host, Lease.pid, Job.worker)
            .join(Lease, Lease.job_id == Job.id)
            .where(Job.id == job_id)
        ).first()
    if found is None:
        return None
    state, host, pid, worker = found
    if state != "running" or pid is None or host not in HOSTS:
        return None
    assert (worker or "").endswith(f"@{host}"), (worker, host)
    if not _runs(state_dirs[host], job_id):
        return None  # not started yet: the kill must land mid-job
    return host, pid


def test_a_gpu_host_killed_mid_job_its_job_completes_on_the_other(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    need_shared_nothing(backend, workers)
    need_namespaces()
    settings = workers.settings
    repo = make_repo(tmp_path, "hosts-kill")
    # A longer point than the probe's default space offers, so the kill lands mid-job.
    toml = repo / "autopilot.toml"
    declared = toml.read_text()
    assert "sleep_s = [0.05," in declared
    toml.write_text(declared.replace("sleep_s = [0.05,", "sleep_s = [6, 0.05,"))
    subprocess.run(["git", "commit", "-qam", "a 6 s point"], cwd=repo, check=True)
    token = _project(stores, repo)
    workers.start("control", "control", "--beat")
    state_dirs = _start_hosts(workers, tmp_path, [settings.state_dir.absolute(), repo])
    wait_for(lambda: _registered(stores), timeout=60)

    with TestClient(create_app(settings, stores)) as client:
        made = client.post(
            "/api/v1/cycles",
            headers=bearer(token),
            json={"project": repo.name, "experiment": "probe", "parameters": {"sleep_s": 6}},
        )
        assert made.status_code == 201, made.text
        cycle_id = made.json()["id"]

        def cycle() -> dict[str, Any]:
            body: dict[str, Any] = client.get(
                f"/api/v1/cycles/{cycle_id}", headers=bearer(token)
            ).json()
            return body

        job_id = wait_for(lambda: cycle()["job_id"], timeout=90)
        try:
            found = wait_for(lambda: _running_on(stores, state_dirs, job_id), timeout=90)
        except AssertionError:
            raise AssertionError(
                f"job {job_id} never ran: {cycle()}\n{workers.logs()[-6000:]}"
            ) from None
        assert found is not None
        victim, pid = found
        survivor = next(h for h in HOSTS if h != victim)
        killed_at = time.monotonic()
        workers.kill(victim)  # SIGKILL to the host's whole process group
        wait_for(lambda: not alive(pid), timeout=10)  # the experiment died with its host

        try:
            ended = wait_for(lambda: (c := cycle())["state"] in ENDED and c, timeout=120)
        except AssertionError:
            raise AssertionError(
                f"cycle not settled: {cycle()}\n{workers.logs()[-6000:]}"
            ) from None
    recovered_s = time.monotonic() - killed_at
    logs = workers.logs()
    assert ended["state"] == "awaiting_review", (ended, logs[-6000:])
    row = job_rows(stores, [job_id])[job_id]
    assert row.state == "succeeded", (row.state, row.error, logs[-4000:])
    assert _host_of(row) == survivor, (row.worker, victim, logs[-4000:])
    assert row.attempts == 2, (row.attempts, logs[-4000:])
    # One start on each host: the killed one, and the one that completed.
    assert len(_runs(state_dirs[victim], job_id)) == 1
    assert len(_runs(state_dirs[survivor], job_id)) == 1
    assert Path(row.workdir or "").is_relative_to(state_dirs[survivor]), row.workdir
    assert leases_of(stores, [job_id]) == []
    figures["hosts_sigkill_host_mid_job[postgres-redis]"] = {
        "faults_injected": 1,
        "job_sleep_s": 6,
        "lease_ttl_s": settings.lease_ttl_s,
        "kill_to_review_s": round(recovered_s, 1),
    }
