"""deploy/slurm/autopilot-gpu-host.sbatch with real GPU workers: the script run by bash under
Slurm's environment variables (a two-GPU allocation that ends in a minute or so), its workers CPU
"GPU" workers on the queue tests' real control plane (API, control worker with beat, broker, ops
DB). No job is lost: what the allocation does not finish stays queued, untouched, and a worker
started afterwards runs it; and no job is leased whose time limit passes the deadline."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import git
import pytest

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.projects.service import ProjectNotFound
from app.settings import Settings
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import wait_for
from workers import prepare

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).resolve().parents[3] / "deploy" / "slurm" / "autopilot-gpu-host.sbatch"
SHORT_LIMIT_S = 8
CONFIG = f"""
[project]
name = "{{name}}"
gpu_kind = "cpu"
python_requirements = []

[experiments.probe]
entry = "probe.main"
time_limit_s = {SHORT_LIMIT_S}

[experiments.probe.parameters]
sleep_s = [0.05, 0.2, 0.5, 3]
grandchild = [0]

[experiments.probe.defaults]
sleep_s = 0.2
grandchild = 0

# The same code, declared long: no allocation that ends within 10 minutes may take it.
[experiments.slow]
entry = "probe.main"
time_limit_s = 600

[experiments.slow.parameters]
sleep_s = [0.05]
grandchild = [0]

[experiments.slow.defaults]
sleep_s = 0.05
grandchild = 0
"""


def slurm_repo(root: Path, name: str) -> Path:
    repo_dir = make_repo(root, name)
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name))
    repo = git.Repo(repo_dir)
    repo.index.add(["autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("a short and a slow experiment", author=actor, committer=actor)
    return repo_dir


@dataclass
class Allocation:
    """The batch script as Slurm would run it on a node: its env, its state dir, its deadline."""

    workers: Workers
    root: Path
    end: int
    margin_s: int
    proc: subprocess.Popen[str] | None = None
    output: list[str] = field(default_factory=list)

    @property
    def state_dir(self) -> Path:
        return self.root / "node-local" / "autopilot"

    @property
    def deadline(self) -> int:
        return self.end - self.margin_s

    def gpu_settings(self) -> Settings:
        return self.workers.settings.model_copy(update={"state_dir": self.state_dir})

    def env(self) -> dict[str, str]:
        s = self.workers.settings
        assert s.control_token is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOPILOT_", "SLURM_"))}
        env.update(
            {
                "HOME": str(self.root),
                # a GPU host's settings only (deploy/gpu-host.env.example), as the doctor wants
                "AUTOPILOT_BROKER_URL": s.broker_url,
                "AUTOPILOT_OPS_URL": s.ops_database_url,
                "AUTOPILOT_CONTROL_URL": s.control_url,
                "AUTOPILOT_CONTROL_TOKEN": s.control_token.get_secret_value(),
                "AUTOPILOT_VENV_ROOT": str(s.venv_root),
                "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": "true",
                "AUTOPILOT_LEASE_TTL_S": str(s.lease_ttl_s),
                "AUTOPILOT_HEARTBEAT_INTERVAL_S": str(s.heartbeat_interval_s),
                "AUTOPILOT_SANDBOX": s.sandbox,
                # the script's own
                "AUTOPILOT_CMD": f"{sys.executable} -m workers.cli",
                "AUTOPILOT_GPU_KIND": "cpu",
                "AUTOPILOT_LOG_LEVEL": "WARNING",
                "AUTOPILOT_SLURM_STATE_DIR": str(self.state_dir),
                "AUTOPILOT_SLURM_MARGIN_S": str(self.margin_s),
                # what Slurm sets
                "SLURM_JOB_ID": "777",
                "SLURM_JOB_GPUS": "0,1",
                "SLURM_GPUS_ON_NODE": "2",
                "SLURM_JOB_END_TIME": str(self.end),
            }
        )
        return env

    def prepare_state_dir(self) -> None:
        self.state_dir.mkdir(parents=True)
        s = self.workers.settings
        if s.broker_url.startswith("filesystem://"):
            # The embedded broker is a folder of the control host's state dir: shared by a link.
            s.broker_dir.mkdir(parents=True, exist_ok=True)
            (self.state_dir / "broker").symlink_to(s.broker_dir, target_is_directory=True)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["bash", str(SCRIPT)],
            env=self.env(),
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the allocation did not end:\n{self.log()}") from None

    def kill(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log(self) -> str:
        return "".join(self.output)[-6000:] + "\n" + self.workers.logs()[-4000:]


@pytest.fixture
def allocation(workers: Workers, tmp_path: Path) -> Allocation:
    made = Allocation(workers, tmp_path / "allocation", end=0, margin_s=10)
    made.root.mkdir()
    made.prepare_state_dir()
    workers.start("control", "control", "--beat")
    workers.start_api()  # the GPU hosts' forge and log uploads
    return made


def submit(
    stores: Stores, settings: Settings, repo: Path, experiment: str, **params: object
) -> int:
    with stores.ops_session() as session:
        try:
            project = ops.get_project(session, repo.name)
        except ProjectNotFound:
            project = ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        cfg = project_config.load(repo)
        job_id = jobs.submit(session, settings, project, cfg, experiment, dict(params)).id
    broker.ring_gpu(settings, "gpu.cpu")
    return job_id


def rows(stores: Stores, ids: list[int]) -> dict[int, Job]:
    with stores.ops_session() as session:
        found = {}
        for job_id in ids:
            row = session.get(Job, job_id)
            assert row is not None
            session.expunge(row)
            found[job_id] = row
        return found


def untouched(row: Job) -> bool:
    return row.state == "queued" and row.attempts == 0 and row.leased_at is None


def finish_the_rest(allocation: Allocation, stores: Stores, ids: list[int]) -> dict[int, Job]:
    """A worker with no deadline on the same node (the next allocation there: the node's state
    dir, where the jobs this one prepared wait) runs what the allocation left: nothing lost,
    nothing run twice."""
    workers = allocation.workers
    state_dir = {"AUTOPILOT_STATE_DIR": str(allocation.state_dir)}
    workers.start("gpu-after", "gpu", "--kind", "cpu", "--device", "0", env=state_dir)
    broker.ring_gpu(workers.settings, "gpu.cpu")

    def all_done() -> dict[int, Job] | None:
        found = rows(stores, ids)
        return found if all(r.state in ("succeeded", "failed") for r in found.values()) else None

    try:
        done = wait_for(all_done, timeout=180, interval=0.5)
    except AssertionError:
        states = {i: r.state for i, r in rows(stores, ids).items()}
        raise AssertionError(f"jobs not done: {states}\n{workers.logs()[-6000:]}") from None
    failed = {i: r.error for i, r in done.items() if r.state != "succeeded"}
    assert failed == {}, (failed, workers.logs()[-3000:])
    assert {i: r.attempts for i, r in done.items()} == dict.fromkeys(ids, 1)
    return done


def test_no_lease_runs_past_the_deadline_and_nothing_is_lost(
    allocation: Allocation, workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    """Jobs keep coming until the allocation ends: the workers take those that can end by the
    deadline, none after, drain themselves at the deadline (no USR1 needed), and the script ends."""
    repo = slurm_repo(tmp_path, "slurm-deadline")
    settings = workers.settings
    ids = [submit(stores, settings, repo, "probe", sleep_s=0.5) for _ in range(4)]
    # prepared on this host beforehand (its venv built), as a GPU host would while busy
    prepare.prepare_ahead(stores, allocation.gpu_settings(), "gpu.cpu", want=len(ids))
    allocation.end = int(time.time()) + 50
    allocation.start()
    submitted_at: dict[int, float] = {}
    next_job = 0.0
    try:
        while allocation.running():  # the queue fills as the allocation runs: a job every 2 s
            if time.monotonic() >= next_job:
                job_id = submit(stores, settings, repo, "probe", sleep_s=0.5)
                submitted_at[job_id] = time.time()
                ids.append(job_id)
                next_job = time.monotonic() + 2
            time.sleep(0.1)
        ended = time.time()
        code = allocation.wait(timeout=10)
    finally:
        allocation.kill()
    assert code == 0, allocation.log()
    assert "draining (the deadline)" in "".join(allocation.output)
    assert ended < allocation.end, "the script ends before the allocation does"
    by_allocation = {i: r for i, r in rows(stores, ids).items() if r.leased_at is not None}
    assert len(by_allocation) >= 4, allocation.log()  # it did work
    for job_id, row in by_allocation.items():
        assert row.leased_at is not None
        leased = row.leased_at.timestamp()
        assert leased + row.time_limit_s <= allocation.deadline, (job_id, leased)
        assert row.state == "succeeded" and row.attempts == 1, (job_id, row.error)
    # jobs that came too late to end by the deadline were left alone, for another host
    late = [i for i, t in submitted_at.items() if t > allocation.deadline - SHORT_LIMIT_S + 1]
    assert late and all(untouched(r) for i, r in rows(stores, late).items())
    finish_the_rest(allocation, stores, ids)


def test_usr1_drains_a_running_job_to_its_end_and_a_long_job_is_never_taken(
    allocation: Allocation, workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = slurm_repo(tmp_path, "slurm-drain")
    settings = workers.settings
    first = submit(stores, settings, repo, "probe", sleep_s=0.05)
    running = submit(stores, settings, repo, "probe", sleep_s=3)
    slow = submit(stores, settings, repo, "slow")  # 600 s: past an allocation of 5 minutes
    behind = submit(stores, settings, repo, "probe", sleep_s=0.05)
    ids = [first, running, slow, behind]
    prepare.prepare_ahead(stores, allocation.gpu_settings(), "gpu.cpu", want=len(ids))
    allocation.end = int(time.time()) + 300
    allocation.start()
    try:
        wait_for(lambda: rows(stores, [running])[running].state == "running", timeout=120)
        assert rows(stores, [first])[first].state in ("running", "succeeded")
        assert untouched(rows(stores, [slow])[slow])
        assert allocation.proc is not None
        os.kill(allocation.proc.pid, signal.SIGUSR1)  # Slurm: --signal=B:USR1@300
        code = allocation.wait(timeout=60)
    finally:
        allocation.kill()
    assert code == 0, allocation.log()
    assert "draining (USR1)" in "".join(allocation.output)
    found = rows(stores, ids)
    # the job running at USR1 finished there, once; the long one and the one behind it waited
    assert (found[running].state, found[running].attempts) == ("succeeded", 1), allocation.log()
    assert found[first].state == "succeeded"
    assert untouched(found[slow]) and untouched(found[behind])
    finish_the_rest(allocation, stores, ids)
