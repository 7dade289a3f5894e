"""The cycle service on real stores: the schedule tick, budgets deferring, the autopilot switch."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.cycles import schedules, service
from app.cycles.models import Cycle
from app.db import Stores
from app.errors import InvalidInput
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.support import bearer

# Both stacks: deferred cycles resume under SKIP LOCKED.
pytestmark = pytest.mark.stores("sqlite", "postgres")


def project(stores: Stores, name: str = "sched") -> None:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=name, repo_url=f"/srv/{name}"))


def test_schedule_tick_starts_due_cycles_once(stores: Stores, settings: Settings) -> None:
    project(stores)
    with stores.ops_session() as session:
        schedules.set_autopilot(session, "sched", True, "every 2h")
    with stores.ops_session() as session:
        first = schedules.schedule_tick(session, settings)
    with stores.ops_session() as session:
        again = schedules.schedule_tick(session, settings)  # not due yet: nothing new
    assert len(first) == 1 and again == []
    with stores.ops_session() as session:
        cycle = session.get(Cycle, first[0])
        assert cycle is not None and cycle.trigger == "schedule" and cycle.state == "planned"
        row = ops.get_project(session, "sched")
        row.last_scheduled_at = row.last_scheduled_at - timedelta(hours=3)  # type: ignore[operator]
    with stores.ops_session() as session:
        assert len(schedules.schedule_tick(session, settings)) == 1
    with stores.ops_session() as session:
        schedules.set_autopilot(session, "sched", False, None)
        row = ops.get_project(session, "sched")
        row.last_scheduled_at = None
    with stores.ops_session() as session:
        assert schedules.schedule_tick(session, settings) == []


def test_autopilot_needs_a_valid_schedule(stores: Stores) -> None:
    project(stores)
    with stores.ops_session() as session, pytest.raises(InvalidInput, match="schedule"):
        schedules.set_autopilot(session, "sched", True, None)
    with stores.ops_session() as session, pytest.raises(InvalidInput, match="cron"):
        schedules.set_autopilot(session, "sched", True, "whenever")


def test_deferred_cycle_resumes_when_the_budget_allows(stores: Stores, settings: Settings) -> None:
    project(stores)
    with stores.ops_session() as session:
        cycle, _ = service.create(session, service.Trigger(project="sched"))
        cycle.state = "deferred_budget"
        ops.get_project(session, "sched").budget_concurrent_gpus = 1
        cycle_id = cycle.id
    with stores.ops_session() as session:
        assert schedules.schedule_tick(session, settings) == [cycle_id]
        assert service.get(session, cycle_id).state == "planned"


def test_a_freed_gpu_resumes_the_oldest_deferred_cycle_only(
    stores: Stores, settings: Settings
) -> None:
    project(stores)
    with stores.ops_session() as session:
        ops.get_project(session, "sched").budget_concurrent_gpus = 1
        made = [service.create(session, service.Trigger(project="sched"))[0] for _ in range(3)]
        for cycle in made:
            cycle.state = "deferred_budget"
        ids = [c.id for c in made]
        project_id = made[0].project_id
        busy = Job(
            project_id=project_id,
            experiment="probe",
            queue="gpu.cpu",
            state="running",
            order_key=made[0].created_at,
        )
        session.add(busy)
    with stores.ops_session() as session:  # its one GPU is in use: nothing resumes
        assert schedules.resume_deferred(session, settings, project_id, limit=1) == []
    with stores.ops_session() as session:
        session.get(Job, busy.id).state = "succeeded"  # type: ignore[union-attr]
    with stores.ops_session() as session:
        assert schedules.resume_deferred(session, settings, project_id, limit=1) == [ids[0]]
    with stores.ops_session() as session:
        states = [service.get(session, i).state for i in ids]
    assert states == ["planned", "deferred_budget", "deferred_budget"]


def test_autopilot_route(stores: Stores, settings: Settings, tmp_path: Path) -> None:
    project(stores)
    with stores.ops_session() as session:
        _, token = ops.create_token(session, "t", ["trigger"])
    with TestClient(create_app(settings, stores)) as client:
        on = client.post(
            "/api/v1/projects/sched/autopilot",
            headers=bearer(token),
            json={"enabled": True, "schedule": "0 */2 * * *"},
        )
        assert on.status_code == 200, on.text
        assert on.json()["autopilot_enabled"] is True
        bad = client.post(
            "/api/v1/projects/sched/autopilot",
            headers=bearer(token),
            json={"enabled": True, "schedule": "sometimes"},
        )
        assert bad.status_code == 422
        assert bad.headers["content-type"] == "application/problem+json"
        missing = client.post(
            "/api/v1/projects/nope/autopilot", headers=bearer(token), json={"enabled": False}
        )
        assert missing.status_code == 404


def test_a_step_refused_by_a_busy_sqlite_store_is_retried_not_failed(
    stores: Stores, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLite may refuse a write at once when another connection just wrote (WAL, a
    transaction that read first): the machine treats that as passing, as steps are idempotent."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from app.cycles.machine import Machine
    from app.cycles.steps.plan import Plan

    project(stores)
    with stores.ops_session() as session:
        cycle_id = service.create(session, service.Trigger(project="sched"))[0].id

    def busy(self: Plan, cycle_id: int) -> bool:
        raise OperationalError(
            "INSERT INTO ...", {}, sqlite3.OperationalError("database is locked")
        )

    monkeypatch.setattr(Plan, "run", busy)
    assert Machine(stores, settings).advance(cycle_id) == "planned"  # waits for its retry
    with stores.ops_session() as session:
        assert service.get(session, cycle_id).state == "planned"
        (step,) = service.steps(session, cycle_id)
        assert (step.name, step.status) == ("planned", "retry")
        assert "the store was busy" in (step.detail or "")


def test_the_machine_records_each_step_in_one_session_between_steps(
    stores: Stores, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that moved the cycle is recorded done in the session that begins the next one;
    a step that waits is recorded waiting, and re-checked as the same attempt: the step rows
    are as they were when each took its own session, and an advance opens one per step."""
    from sqlalchemy import event

    from app.cycles import repository
    from app.cycles.machine import Machine
    from app.cycles.steps.plan import Plan
    from app.cycles.steps.prepare import Prepare

    project(stores)
    with stores.ops_session() as session:
        cycle_id = service.create(session, service.Trigger(project="sched"))[0].id

    def moves(self: Plan, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            repository.set_state(session, service.get(session, cycle_id), "preparing")
        return True

    monkeypatch.setattr(Plan, "run", moves)
    monkeypatch.setattr(Prepare, "run", lambda self, cycle_id: False)  # waits
    checkouts: list[object] = []
    listen = (stores.ops_engine, "checkout", lambda *args: checkouts.append(args))
    event.listen(*listen)
    try:
        assert Machine(stores, settings).advance(cycle_id) == "preparing"
    finally:
        event.remove(*listen)
    # begin plan; plan's own; end plan + begin prepare; end prepare (waiting)
    assert len(checkouts) == 4
    assert Machine(stores, settings).advance(cycle_id) == "preparing"  # still waiting
    with stores.ops_session() as session:
        steps = [(s.name, s.attempt, s.status) for s in service.steps(session, cycle_id)]
        finished = [s.finished_at is not None for s in service.steps(session, cycle_id)]
    assert steps == [("planned", 1, "done"), ("preparing", 1, "waiting")]
    assert finished == [True, False]
