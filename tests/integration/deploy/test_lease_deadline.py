"""The lease gate (workers/lease_gate.py) on the real lease code and the real stores (SQLite and
PostgreSQL): a worker with a deadline takes no job whose time limit would run past it, and one
that drains takes nothing more; a job it does not take stays queued, untouched (no lease, its
attempts unchanged), for another worker. Only the run itself is a stand-in here."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db import Stores
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.jobs.models import Lease
from app.settings import Settings
from tests.integration.queue.test_jobs_service import make_project, row, submit
from workers import job_trees
from workers.gpu import run
from workers.gpu.loop import RunLoop
from workers.gpu.reservation import Reservation
from workers.gpu.tickets import Ticket, WorkerIdentity
from workers.lease_gate import LeaseGate, PastDeadline, parse_deadline

# Both stacks: the lease gate rolls the lease's transaction back.
pytestmark = pytest.mark.stores("sqlite", "postgres")


class Outbox:
    def put(self, job_id: int, worker: str) -> None:
        return None


class NoSender:
    """Job logs are not this test's business."""

    outbox = Outbox()


def run_loop(
    stores: Stores,
    settings: Settings,
    gate: LeaseGate,
    name: str = "w1",
    during: Any = None,  # noqa: ANN401
) -> list[int]:
    """One doorbell's loop over the queue; the ids of the jobs it ran, in order."""
    me = WorkerIdentity(name=f"gpu-cpu-{name}", kind="cpu", device="")
    loop = RunLoop(stores, settings, me, sender=NoSender(), gate=gate)  # type: ignore[arg-type]
    ran: list[int] = []

    class StandIn:
        """The run itself (launch, supervise, measure): it succeeds at once."""

        def run(self, job: run.JobRun) -> jobs.JobOutcome:
            ran.append(job.ticket.job_id)
            if during is not None:
                during(job.ticket)
            return jobs.JobOutcome(ended=End.COMPLETED, result={"status": "ok"})

    def stand_in(_ticket: Ticket) -> StandIn:
        return StandIn()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run, "measurement_for", stand_in)
        loop.run_available()
    return ran


@pytest.fixture(autouse=True)
def _no_tree_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_trees, "sweep_in_background", lambda *_: None)


def untouched(stores: Stores, job_id: int) -> bool:
    """Queued as submitted: no lease, no attempt, no worker."""
    job = row(stores, job_id)
    with stores.ops_session() as session:
        leases = session.scalars(select(Lease).where(Lease.job_id == job_id)).all()
    return job.state == "queued" and job.attempts == 0 and job.worker is None and not leases


def test_no_job_is_taken_whose_time_limit_runs_past_the_deadline(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    limits = [30, 60, 300, 30]
    ids = [submit(stores, settings, "alpha", limit=limit) for limit in limits]
    gate = LeaseGate(deadline=time.time() + 100)
    assert run_loop(stores, settings, gate) == ids[:2]
    assert [row(stores, i).state for i in ids[:2]] == ["succeeded", "succeeded"]
    # the first job in line too long for what is left: it and those behind it stay queued
    assert untouched(stores, ids[2]) and untouched(stores, ids[3])
    # another worker, with no deadline, takes them: nothing lost
    assert run_loop(stores, settings, LeaseGate(), name="w2") == ids[2:]
    assert {row(stores, i).state for i in ids} == {"succeeded"}
    assert [row(stores, i).attempts for i in ids] == [1, 1, 1, 1]


def test_the_time_left_decides_not_the_deadline_alone(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    short, long = submit(stores, settings, "alpha", limit=30), submit(stores, settings, "alpha")
    gate = LeaseGate(deadline=time.time() + 45)  # 30 s fits, the default 60 s does not
    assert run_loop(stores, settings, gate) == [short]
    assert untouched(stores, long)
    gate.deadline = time.time() + 61
    assert run_loop(stores, settings, gate) == [long]


def test_a_draining_worker_takes_nothing(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    ids = [submit(stores, settings, "alpha") for _ in range(2)]
    gate = LeaseGate()
    gate.drain()
    assert run_loop(stores, settings, gate) == []
    assert all(untouched(stores, i) for i in ids)


def test_sigterm_during_a_job_ends_the_loop_with_it(stores: Stores, settings: Settings) -> None:
    """The shutdown (`tasks._drain`) comes while a job runs: it finishes, its outcome is
    stored, and nothing more is leased."""
    make_project(stores, "alpha")
    ids = [submit(stores, settings, "alpha") for _ in range(3)]
    gate = LeaseGate()
    assert run_loop(stores, settings, gate, during=lambda _: gate.drain()) == ids[:1]
    assert row(stores, ids[0]).state == "succeeded"
    assert untouched(stores, ids[1]) and untouched(stores, ids[2])


def test_a_reservation_past_the_deadline_is_never_made(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    long, short = submit(stores, settings, "alpha", limit=300), submit(stores, settings, "alpha")
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    me = WorkerIdentity(name="gpu-cpu-w1", kind="cpu", device="")
    gate = LeaseGate(deadline=time.time() + 100)
    nxt = Reservation(stores, at_once, me, spares=None, discard=lambda _: None, gate=gate)  # type: ignore[arg-type]
    assert nxt.reserve() is None  # the first in line is too long: not reserved, rolled back
    assert untouched(stores, long) and untouched(stores, short)
    gate.deadline = time.time() + 400
    reserved = nxt.reserve()
    assert reserved is not None and reserved.job_id == long
    # the worker drains before its turn comes: the reservation is given back
    gate.drain()
    assert nxt.take() is None
    assert untouched(stores, long)


def test_a_reserved_job_that_no_longer_fits_is_given_back(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", limit=30)
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    me = WorkerIdentity(name="gpu-cpu-w1", kind="cpu", device="")
    gate = LeaseGate(deadline=time.time() + 100)
    nxt = Reservation(stores, at_once, me, spares=None, discard=lambda _: None, gate=gate)  # type: ignore[arg-type]
    assert nxt.reserve() is not None
    gate.deadline = time.time() + 10  # its turn came later than it would have fitted
    nxt.go()  # nothing staged, and nothing started
    assert nxt.take() is None
    assert untouched(stores, job_id)


def test_the_check_raises_only_past_the_deadline() -> None:
    gate = LeaseGate(deadline=time.time() + 100)
    gate.check(1, 60)
    with pytest.raises(PastDeadline, match="job 2 not taken: its time limit of 300 s runs past"):
        gate.check(2, 300)
    assert gate.admits(60) and not gate.admits(300)
    assert LeaseGate().admits(10**9)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("1767225600", 1767225600.0),
        ("1767225600.5", 1767225600.5),
        ("2026-01-01T00:00:00Z", 1767225600.0),
        ("2026-01-01T01:00:00+01:00", 1767225600.0),
    ],
)
def test_a_deadline_is_epoch_seconds_or_iso_with_an_offset(text: str, epoch: float) -> None:
    assert parse_deadline(text) == epoch


@pytest.mark.parametrize("text", ["2026-01-01T00:00:00", "tomorrow", ""])
def test_a_deadline_without_an_offset_or_a_time_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected epoch seconds .* or an ISO 8601 time"):
        parse_deadline(text)


def test_the_worker_refuses_a_deadline_it_cannot_read(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from workers.commands import cli

    result = CliRunner().invoke(
        cli,
        ["worker", "gpu", "--kind", "cpu"],
        env={"AUTOPILOT_WORKER_DEADLINE": "2026-01-01 00:00", "AUTOPILOT_STATE_DIR": str(tmp_path)},
    )
    assert result.exit_code == 2
    assert "--deadline / AUTOPILOT_WORKER_DEADLINE: '2026-01-01 00:00' has no UTC offset" in (
        result.output
    )
