"""The cycle lifecycle on real stores: a cycle cancelled while its step runs stays cancelled;
the step's late move is refused, naming both states, and recorded on the step."""

from __future__ import annotations

import pytest

from app.cycles import repository, service
from app.cycles.machine import Machine
from app.cycles.steps.plan import Plan
from app.cycles.steps.wait_for_job import WaitForJob
from app.db import Stores
from app.jobs.models import Job
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


@pytest.mark.parametrize("job_state", ["queued", "reserved"])
def test_a_cycle_whose_job_waits_stays_queued(
    stores: Stores, settings: Settings, job_state: str
) -> None:
    """A job a busy worker reserved (app/jobs/reservations.py) has not started: its cycle waits
    as for a queued one, neither running nor failed."""
    cycle_id = planned_cycle(stores)
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        repository.set_state(session, cycle, "preparing")
        repository.set_state(session, cycle, "queued")
        project = ops.get_project(session, "moves")
        session.add(
            Job(
                cycle_id=cycle_id,
                project_id=project.id,
                experiment="probe",
                queue="gpu.cpu",
                state=job_state,
            )
        )
    assert not WaitForJob(stores, settings).run(cycle_id)
    with stores.ops_session() as session:
        assert (service.get(session, cycle_id).state, service.get(session, cycle_id).error) == (
            "queued",
            None,
        )
