"""A finished job's log is never missing: a GPU worker killed after storing a job's outcome and
before the control host took its log leaves the log in its host's outbox, and the next worker
that starts on that host sends it, whole.

The fault is the test's: the control host's API is not up yet when the job ends (nothing listens
on the control URL), so the upload is refused and the log waits in the outbox; the worker is
then SIGKILLed, the API brought up, and a new worker started with the same state dir.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.db import Stores
from app.jobs import paths
from app.settings import Settings
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers, make_repo, settings_env
from tests.reliability.conftest import job, submit, variant
from tests.support import port_open, wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(180),
]


def _start_gpu_worker(workers: Workers, name: str, state_dir: Path) -> subprocess.Popen[bytes]:
    """A GPU worker of another host's state dir (sharing the ops DB and broker only), started
    without the API the queue fixture would start with it."""
    settings = workers.settings
    if settings.broker_url.startswith("filesystem://"):
        # The embedded broker is a folder of the control host's state dir: shared by a link.
        link = state_dir / "broker"
        if not link.exists():
            settings.broker_dir.mkdir(parents=True, exist_ok=True)
            link.symlink_to(settings.broker_dir, target_is_directory=True)
    env = {**settings_env(settings), "AUTOPILOT_STATE_DIR": str(state_dir)}
    log = open(workers.log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "worker", "gpu", "--kind", "cpu"]
        + ["--device", "0", "--loglevel", "WARNING"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=state_dir,
        start_new_session=True,
    )
    workers.procs[name] = proc
    return proc


def _outbox(state_dir: Path, job_id: int) -> list[Path]:
    folder = state_dir / "outbox"
    return [p for p in folder.glob(f"{job_id}~*")] if folder.is_dir() else []


def test_a_log_left_in_the_outbox_by_a_killed_worker_reaches_the_control_host(
    workers: Workers,
    stores: Stores,
    tmp_path: Path,
    backend: Backend,
    figures: dict[str, Any],
) -> None:
    settings: Settings = workers.settings
    port = int(settings.control_url.rsplit(":", 1)[1])
    assert not port_open(port)  # the fault: the control host's API is away
    gpu_state = tmp_path / "gpu-host"
    gpu_state.mkdir()
    repo = make_repo(tmp_path, "outbox-probe")
    job_id = submit(stores, settings, repo, sleep_s=0.05, grandchild=0)
    _start_gpu_worker(workers, "gpu-1", gpu_state)

    def ended_with_log_waiting() -> bool:
        row = job(stores, job_id)
        return row.state == "succeeded" and bool(_outbox(gpu_state, job_id))

    try:
        wait_for(ended_with_log_waiting, timeout=90)
    except AssertionError:
        raise AssertionError(
            f"job {job_id}: {job(stores, job_id).state}\n{workers.logs()[-6000:]}"
        ) from None
    control_log = paths.log_path(settings, job_id)
    host_log = gpu_state / "jobs" / str(job_id) / "job.log"
    assert job(stores, job_id).log_received_at is None
    assert not control_log.exists()
    assert host_log.stat().st_size > 0
    workers.kill("gpu-1")  # SIGKILL between the outcome and the upload

    workers.start_api()
    _start_gpu_worker(workers, "gpu-2", gpu_state)  # another worker of the same host

    def arrived() -> bool:
        row = job(stores, job_id)
        return row.log_received_at is not None and not _outbox(gpu_state, job_id)

    try:
        wait_for(arrived, timeout=60)
    except AssertionError:
        raise AssertionError(f"the log never arrived\n{workers.logs()[-6000:]}") from None
    assert control_log.read_bytes() == host_log.read_bytes()
    row = job(stores, job_id)
    assert row.state == "succeeded" and row.log_path == str(control_log)
    figures[f"log_outbox_worker_killed[{variant(backend.name, settings)}]"] = {
        "faults_injected": 2,  # the API away, the worker killed
        "log_bytes": host_log.stat().st_size,
        "log_arrived_whole": True,
    }
