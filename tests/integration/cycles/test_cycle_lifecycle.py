"""The cycle lifecycle on real stores: a cycle cancelled while its step runs stays cancelled;
the step's late move is refused, naming both states, and recorded on the step."""

from __future__ import annotations

import pytest

from app.cycles import repository, service
from app.cycles.machine import Machine
from app.cycles.steps.plan import Plan
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from app.statemachine import IllegalMove


def planned_cycle(stores: Stores) -> int:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="moves", repo_url="/srv/moves"))
    with stores.ops_session() as session:
        return service.create(session, service.Trigger(project="moves"))[0].id


def test_a_cycle_cancelled_under_its_step_stays_cancelled(
    stores: Stores, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    cycle_id = planned_cycle(stores)

    def cancelled_meanwhile(self: Plan, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            service.cancel(session, cycle_id, by="someone")
        with self.stores.ops_session() as session:  # the step's work done, it moves on
            repository.set_state(session, service.get(session, cycle_id), "preparing")
        return True

    monkeypatch.setattr(Plan, "run", cancelled_meanwhile)
    assert Machine(stores, settings).advance(cycle_id) == "cancelled"
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        assert (cycle.state, cycle.error) == ("cancelled", "cancelled by someone")
        (step,) = service.steps(session, cycle_id)
    assert (step.name, step.status) == ("planned", "failed")
    assert "cannot move from cancelled to preparing" in (step.detail or "")


def test_set_state_refuses_an_illegal_move(stores: Stores) -> None:
    cycle_id = planned_cycle(stores)
    with stores.ops_session() as session, pytest.raises(IllegalMove, match="planned to approved"):
        repository.set_state(session, service.get(session, cycle_id), "approved")
    with stores.ops_session() as session:
        assert service.get(session, cycle_id).state == "planned"
