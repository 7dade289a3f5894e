"""A job of two GPUs started by torchrun, end to end: the shipped
experiments/projects/allreduce_ddp (`python -m torch.distributed.run --standalone
--nproc_per_node={gpus} allreduce.py ...`, two gloo processes all-reducing on the CPU) runs
through a real cycle, on the real control worker and two real CPU GPU workers (devices 0 and 1)
of one host on the real broker, sandboxed, and is judged by the control plane
(docs/design.md, "Jobs of several GPUs"; docs/experiments.md, command experiments)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.jobs.models import GangSeat, Job, Worker
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.cycles.test_command_cycle import committed
from tests.integration.queue.conftest import Workers
from tests.support import bearer, wait_for

EXAMPLE = Path(__file__).resolve().parents[3] / "experiments" / "projects" / "allreduce_ddp"
PROJECT = "allreduce-ddp"
#: What rank 0 prints (allreduce.py): the world torchrun made and the devices the job was given.
WORLD = re.compile(r"allreduce backend gloo world_size (\d+) size (\d+) iters (\d+) visible (\S+)")


@pytest.fixture
def queue_sandbox() -> str:
    """The workers run torchrun sandboxed (no network: the ranks meet on the loopback), as a
    GPU host does."""
    return "on"


def example_repo(root: Path) -> Path:
    """experiments/projects/allreduce_ddp as a lab has it, in a git repository of its own."""
    repo_dir = root / PROJECT
    shutil.copytree(EXAMPLE, repo_dir, ignore=shutil.ignore_patterns("__pycache__"))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["allreduce.py", "autopilot.toml", "README.md"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("an all-reduce across the GPUs of one host", author=actor, committer=actor)
    return repo_dir


def test_a_torchrun_job_of_two_gpus_runs_through_a_cycle_and_is_judged(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: torchrun's world does not depend on the stores")
    repo = example_repo(tmp_path)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=PROJECT, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    workers.start("gpu0", "gpu", "--kind", "cpu", "--device", "0")
    workers.start("gpu1", "gpu", "--kind", "cpu", "--device", "1")

    # Who held the job's GPUs while it ran: its leader's lease and the other worker's seat.
    seats: set[tuple[int, str]] = set()

    def look_at_seats() -> None:
        with stores.ops_session() as session:
            seats.update((s.job_id, s.worker) for s in session.query(GangSeat))

    body = {"project": PROJECT, "experiment": "allreduce", "parameters": {"size": 1048576}}
    with TestClient(create_app(workers.settings, stores)) as client:
        created = client.post("/api/v1/cycles", json=body, headers=bearer(token))
        assert created.status_code == 201, created.text
        cycle_id = created.json()["id"]

        def ended() -> dict[str, Any] | None:
            look_at_seats()
            got = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
            return got if got["state"] in ("awaiting_review", "failed") else None

        cycle: dict[str, Any] = wait_for(ended, timeout=400, interval=0.2)
    assert cycle["state"] == "awaiting_review", (cycle, workers.logs())

    # Judged by the control plane on the runner's clock: a verdict, trusted.
    head = cycle["headline"]
    assert cycle["verdict"] in ("faster", "slower", "inconclusive"), cycle
    assert head["metric"] == "run_s" and head["metric_source"] == "wall", head
    assert head["trusted"] is True, head
    judged = json.loads(committed(workers, PROJECT, cycle, "result.json"))
    assert judged["verdict"] == cycle["verdict"]
    assert judged["judgement"]["by"] == "control-plane"
    assert f"**Verdict: {cycle['verdict']}**" in committed(workers, PROJECT, cycle, "REPORT.md")

    with stores.ops_session() as session:
        job = session.query(Job).filter_by(cycle_id=cycle_id).one()
        job_id, leader = job.id, job.worker
        gpus, state, attempts = job.gpus, job.state, job.attempts
        result = dict(job.result or {})
        log_path = Path(str(job.log_path))
        devices = {w.name: w.devices for w in session.query(Worker)}
        assert session.query(GangSeat).count() == 0  # its seat went with the job
    assert (gpus, state, attempts) == (2, "succeeded", 1), (gpus, state, attempts)

    # Leased by one worker with the other seated beside it: both devices of the host.
    assert leader in devices, (leader, devices)
    members = {worker for job, worker in seats if job == job_id}
    assert len(members) == 1 and leader not in members, (leader, seats)
    assert {devices[str(leader)], *(devices[m] for m in members)} == {"0", "1"}, devices
    assert result["environment"]["device"] == "0,1", result["environment"]

    # torchrun was told the job's GPUs: two processes, the two devices, both arms.
    assert result["sandbox"] == "on"
    for arm, size in (("baseline", 65536), ("candidate", 1048576)):
        argv = result["arms"][arm]["command"]
        assert argv[:5] == ["python", "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node=2"], argv  # fmt: skip
        assert argv[5:] == ["allreduce.py", f"--size={size}", "--iters=20", "--devices=0,1"]
    assert len(result["runs"]) == 3 * 3  # 3 blocks of baseline, candidate and A/A baseline

    # Every run reached a world of two ranks whose sums were right (a wrong one exits non-zero
    # and fails the job), on CUDA_VISIBLE_DEVICES listing two devices.
    logs = sorted((log_path.parent / "runs").glob("*.log"))
    assert len(logs) == 9, [p.name for p in logs]
    for log in logs:
        seen = WORLD.findall(log.read_text(errors="replace"))
        assert len(seen) == 1, (log.name, log.read_text(errors="replace")[-2000:])
        world, size, _, visible = seen[0]
        assert world == "2" and visible == "0,1", (log.name, seen)
        arm = "candidate" if log.name.endswith("-candidate.log") else "baseline"
        assert int(size) == (1048576 if arm == "candidate" else 65536), (log.name, seen)
