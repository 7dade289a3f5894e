"""Jobs of several GPUs on real GPU worker processes (CPU "GPU" workers, one per device number) on
a real broker (docs/design.md, "Jobs of several GPUs"): a mix of 1-, 2- and 4-GPU jobs all
finish, no device is ever held by two jobs at once, each job sees exactly its devices, a 4-GPU
job is not starved by 1-GPU jobs that keep arriving, and the SIGKILL of a member worker frees
every GPU of its job, which then completes once on retry. Also over two hosts in namespaces."""

from __future__ import annotations

import textwrap
import threading
from pathlib import Path

import git
import pytest

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import GangSeat, Job, Worker
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers
from tests.integration.queue.test_workers import finished, job, runs
from tests.reliability.test_hosts import need_namespaces, need_shared_nothing
from tests.support import wait_for

PROBE = '''
"""Records what it saw: its devices and when it held them, then sleeps."""
import json, os, socket, time

def send(event):
    path = os.environ.get("AUTOPILOT_EVENTS")
    if path:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.sendall((json.dumps(event) + "\\n").encode())
        s.close()

send({"type": "started"})
start = time.time()
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
here = os.path.dirname(os.path.abspath("."))
with open(os.path.join(here, "runs.txt"), "a") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(spec["parameters"]["sleep_s"])
a = [1000000 + 997 * (i % 5) for i in range(10)]
pairs = {"a_ns": a, "b_ns": list(a)}
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": spec["parameters"],
           "seen": {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
                    "end": time.time(), "pid": os.getpid()},
           "noise_floor": {"samples": pairs},
           "comparisons": [{"variant": "probe", "baseline": "base", "samples": pairs,
                            "accuracy": {"max_abs_error": 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
'''

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
python_requirements = []
{experiments}
"""

EXPERIMENT = """
[experiments.{name}]
entry = "gangprobe.main"
time_limit_s = 60
gpus = {gpus}
[experiments.{name}.parameters]
sleep_s = [0.3, 0.5, 1, 2, 5]
[experiments.{name}.defaults]
sleep_s = 0.5
"""


def make_repo(root: Path, name: str) -> Path:
    repo_dir = root / name
    (repo_dir / "gangprobe").mkdir(parents=True)
    (repo_dir / "gangprobe" / "__init__.py").write_text("")
    (repo_dir / "gangprobe" / "main.py").write_text(textwrap.dedent(PROBE))
    experiments = "".join(
        EXPERIMENT.format(name=n, gpus=g) for n, g in (("one", 1), ("two", 2), ("four", 4))
    )
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name, experiments=experiments))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["gangprobe/__init__.py", "gangprobe/main.py", "autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("gang probe", author=actor, committer=actor)
    return repo_dir


def submit(stores: Stores, workers: Workers, repo: Path, experiment: str, sleep_s: float) -> int:
    with stores.ops_session() as session:
        from app.projects import repository

        project = repository.get_project(session, repo.name) or ops.create_project(
            session, ProjectCreate(name=repo.name, repo_url=str(repo))
        )
        cfg = project_config.load(repo)
        job_id = jobs.submit(
            session, workers.settings, project, cfg, experiment, {"sleep_s": sleep_s}
        ).id
    broker.ring_gpu(workers.settings, "gpu.cpu")
    return job_id


def worker_of(stores: Stores, name: str) -> Worker:
    with stores.ops_session() as session:
        row = session.query(Worker).filter(Worker.name == name).one()
        session.expunge(row)
        return row


def seated(stores: Stores, job_id: int) -> list[str]:
    with stores.ops_session() as session:
        return [s.worker for s in session.query(GangSeat).filter(GangSeat.job_id == job_id)]


def check_assignments(stores: Stores, done: list[Job], hosts: dict[str, str]) -> None:
    """Each job saw exactly its GPUs (as many as it asked for, its leader's among them, all on
    its leader's host), and no device of a host was held by two jobs at once."""
    held: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for row in done:
        assert row.state == "succeeded", (row.id, row.error)
        assert row.result is not None
        seen = row.result["seen"]
        devices = seen["devices"].split(",")
        assert len(set(devices)) == len(devices) == row.gpus, (row.id, seen)
        leader = worker_of(stores, str(row.worker))
        assert leader.devices in devices, (row.id, leader.devices, seen)
        for device in devices:
            held.setdefault((hosts.get(leader.host, leader.host), device), []).append(
                (seen["start"], seen["end"], row.id)
            )
    for (host, device), spans in held.items():
        spans.sort()
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            assert end <= start, f"device {device} of {host} held by jobs {a} and {b} at once"


@pytest.mark.stores("sqlite", "postgres")  # four workers lease gangs under PostgreSQL's locks
def test_a_mix_of_gang_sizes_on_four_workers_of_one_host(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "gangs")
    workers.start("control", "control", "--beat")
    for device in range(4):
        workers.start(f"gpu{device}", "gpu", "--kind", "cpu", "--device", str(device))
    ids = [submit(stores, workers, repo, "one", 1) for _ in range(3)]
    ids.append(submit(stores, workers, repo, "two", 1))
    gang = submit(stores, workers, repo, "four", 0.5)
    # The four-GPU job is in line (prepared) while the jobs before it hold GPUs; from now on
    # one-GPU jobs keep arriving.
    wait_for(lambda: job(stores, gang).prepared_at is not None, timeout=120)
    arriving: list[int] = []
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set() and len(arriving) < 12:
            arriving.append(submit(stores, workers, repo, "one", 0.3))
            stop.wait(0.25)

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        started = wait_for(lambda: job(stores, gang).started_at, timeout=120)
    finally:
        stop.set()
        feeder.join()
    ids += [submit(stores, workers, repo, "two", 0.3), submit(stores, workers, repo, "one", 0.3)]
    done = [wait_for(lambda i=i: finished(stores, i), timeout=180) for i in [*ids, gang, *arriving]]
    check_assignments(stores, done, {})
    # Not starved: no one-GPU job that arrived after it was in line started before it (their
    # time limits end after the running jobs': none could backfill).
    before = [i for i in arriving if job(stores, i).started_at < started]  # type: ignore[operator]
    assert before == [], (before, workers.logs())
    assert job(stores, gang).attempts == 1
    with stores.ops_session() as session:
        assert session.query(GangSeat).count() == 0


def test_sigkill_of_a_member_frees_every_gpu_and_the_job_completes_once(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "gangs-kill")
    workers.start("control", "control", "--beat")
    for device in range(4):
        workers.start(f"gpu{device}", "gpu", "--kind", "cpu", "--device", str(device))
    gang = submit(stores, workers, repo, "four", 5)
    wait_for(lambda: job(stores, gang).state == "running" and runs(workers, gang), timeout=120)
    first_pid = runs(workers, gang)[0]
    leader = str(job(stores, gang).worker)
    member = next(name for name in seated(stores, gang))
    assert member != leader
    workers.kill(f"gpu{worker_of(stores, member).devices}")
    # The leader sees its member gone: it kills the job and gives it back; all four GPUs free.
    wait_for(lambda: not Path(f"/proc/{first_pid}").exists(), timeout=30)
    wait_for(lambda: job(stores, gang).state in ("queued", "leased", "running"), timeout=30)
    wait_for(lambda: seated(stores, gang) == [] or job(stores, gang).attempts >= 2, timeout=30)
    # Its GPUs are anyone's again: a one-GPU job runs on the three workers left.
    single = submit(stores, workers, repo, "one", 0.3)
    assert wait_for(lambda: finished(stores, single), timeout=120).state == "succeeded"
    # The killed worker comes back (as systemd or Kubernetes restarts it); the job runs again.
    workers.start(f"gpu{worker_of(stores, member).devices}", "gpu", "--kind", "cpu",
                  "--device", worker_of(stores, member).devices)  # fmt: skip
    done = wait_for(lambda: finished(stores, gang), timeout=180)
    assert done.state == "succeeded", (done.error, workers.logs())
    assert done.attempts >= 2
    assert len(runs(workers, gang)) == done.attempts  # killed once, completed once
    check_assignments(stores, [done], {})


@pytest.mark.stores(
    "postgres",
)  # hosts share only Redis and PostgreSQL
def test_gang_jobs_over_two_hosts_in_namespaces(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    need_namespaces()
    need_shared_nothing(backend, workers)
    repo = make_repo(tmp_path, "gangs-hosts")
    workers.start("control", "control", "--beat")
    hidden = [workers.settings.state_dir.absolute()]
    names: dict[str, str] = {}
    for host in ("gpu-host-a", "gpu-host-b"):
        state = tmp_path / host
        for device in ("0", "1"):
            workers.start_gpu_host(f"{host}-{device}", host, state, hidden, device=device)
        names[host] = host
    kinds = ["one", "two", "one", "two", "two", "one", "one", "two"]
    ids = [submit(stores, workers, repo, kind, 0.5) for kind in kinds]
    done = [wait_for(lambda i=i: finished(stores, i), timeout=240) for i in ids]
    check_assignments(stores, done, names)
    hosts = {worker_of(stores, str(row.worker)).host for row in done}
    assert hosts <= {"gpu-host-a", "gpu-host-b"}
