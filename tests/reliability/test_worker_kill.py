"""SIGKILL a GPU worker mid-job, again and again: every job still completes exactly once."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db import Stores
from app.jobs.models import Job, Lease
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers, make_repo
from tests.reliability.conftest import (
    all_finished,
    leases_of,
    runs,
    submit,
    tally,
    variant,
)
from tests.support import alive, wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(240),
]

KILLS = 5
BATCH = 10
SLEEP_S = 3


def _victim(stores: Stores, workers: Workers, ids: list[int]) -> tuple[int, str, int] | None:
    """A job on its first attempt whose experiment runs now: (job id, worker proc name, pid)."""
    with stores.ops_session() as session:
        rows = session.execute(
            select(Job.id, Job.worker, Lease.pid)
            .join(Lease, Lease.job_id == Job.id)
            .where(Job.id.in_(ids), Job.state == "running", Job.attempts == 1)
            .order_by(Job.id)
        ).all()
    for job_id, worker_name, pid in rows:
        if pid is None or not runs(workers.settings, job_id):
            continue  # not started yet: the kill must land mid-job
        for name, proc in workers.procs.items():
            if name.startswith("gpu") and f"-{proc.pid}@" in (worker_name or ""):
                return job_id, name, pid
    return None


def test_sigkill_gpu_worker_mid_job_n_times(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    settings = workers.settings
    repo = make_repo(tmp_path, "probe-kill")
    workers.start("control", "control", "--beat")
    devices = {"gpu0": "0", "gpu1": "1"}
    for name, device in devices.items():
        workers.start(name, "gpu", "--kind", "cpu", "--device", device)
    began = time.monotonic()
    ids = [submit(stores, settings, repo, sleep_s=SLEEP_S) for _ in range(BATCH)]

    killed: dict[int, datetime] = {}
    for _ in range(KILLS):
        job_id, name, pid = wait_for(lambda: _victim(stores, workers, ids), timeout=90)
        killed[job_id] = datetime.now(UTC)
        workers.kill(name)
        # The experiment dies with its worker (PR_SET_PDEATHSIG): no orphan keeps the GPU.
        wait_for(lambda: not alive(pid), timeout=10)
        workers.start(name, "gpu", "--kind", "cpu", "--device", devices[name])

    rows = wait_for(lambda: all_finished(stores, ids), timeout=150)
    wall_s = time.monotonic() - began
    logs = workers.logs()
    assert all(r.state == "succeeded" for r in rows.values()), (
        {i: (r.state, r.error) for i, r in rows.items()},
        logs[-4000:],
    )
    for job_id, row in rows.items():
        # Every attempt is a recorded lease, every start of the experiment is an attempt, and
        # exactly one outcome stands (one row, `succeeded`).
        assert len(runs(settings, job_id)) == row.attempts, (job_id, row.attempts)
        if job_id in killed:
            assert row.attempts >= 2, job_id
    assert leases_of(stores, ids) == []  # no job left leased
    assert len(killed) == KILLS

    counts = tally(settings, rows)
    assert counts["lost"] == 0 and counts["duplicated"] == 0
    requeue_s = [
        (_aware(rows[j].leased_at) - at).total_seconds()
        for j, at in killed.items()
        if rows[j].leased_at is not None
    ]
    figures[f"sigkill_gpu_worker[{variant(backend.name, settings)}]"] = {
        "faults_injected": KILLS,
        **counts,
        "job_sleep_s": SLEEP_S,
        "gpu_workers": len(devices),
        "lease_ttl_s": settings.lease_ttl_s,
        "reaper_interval_s": settings.reaper_interval_s,
        "kill_to_new_lease_s_max": round(max(requeue_s), 2) if requeue_s else None,
        "wall_s": round(wall_s, 1),
    }


def _aware(value: datetime | None) -> datetime:
    assert value is not None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
