"""Sweeps of one project planned at once pick different points (issue 18: a control worker
with many threads plans many cycles of a project side by side; lesson 5 says no two runs of one
hypothesis without a stated change)."""

from __future__ import annotations

import threading
from pathlib import Path

from app import db
from app.cycles import service
from app.cycles.steps.plan import Plan
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo

CYCLES = 6


def test_concurrent_sweep_plans_choose_distinct_points(
    stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "fleet")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="fleet", repo_url=str(repo)))
    with stores.ops_session() as session:
        ids = [
            service.create(session, service.Trigger(project="fleet"))[0].id for _ in range(CYCLES)
        ]
    errors: list[BaseException] = []
    start = threading.Barrier(CYCLES)

    def plan(cycle_id: int) -> None:
        start.wait(timeout=30)
        for _ in range(20):  # a store busy with another writer: the machine would retry
            try:
                Plan(stores, settings).run(cycle_id)
                return
            except Exception as exc:
                if not db.lock_contention(exc):
                    errors.append(exc)
                    return
        errors.append(RuntimeError(f"cycle {cycle_id}: the store stayed busy"))

    threads = [threading.Thread(target=plan, args=(cid,)) for cid in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with stores.ops_session() as session:
        cycles = [service.get(session, cid) for cid in ids]
        assert {c.state for c in cycles} == {"preparing"}
        points = [tuple(sorted((c.parameters or {}).items())) for c in cycles]
        assert len(set(points)) == CYCLES, points
        assert len({c.fingerprint for c in cycles}) == CYCLES
