"""Reservations (app/jobs/reservations.py) on the real stores: a worker's next job, leased while
its current job runs. Its place in the order, the budgets, cancellation, the reaper, release."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from app.db import Stores
from app.jobs import reaping, reservations
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.jobs.models import JobPreparation, Lease
from app.settings import Settings
from tests.integration.queue.test_jobs_service import (
    expire_lease,
    finish,
    lease,
    make_project,
    row,
    submit,
)


def reserve(
    stores: Stores, settings: Settings, worker: str = "w1", after_s: float = 0.0
) -> int | None:
    at_once = settings.model_copy(update={"gpu_reserve_after_s": after_s})
    with stores.ops_session() as session:
        job = reservations.reserve_next(session, at_once, queue="gpu.cpu", worker=worker, device="")
        return job.id if job else None


def start(stores: Stores, job_id: int, worker: str = "w1") -> None:
    with stores.ops_session() as session:
        reservations.start_reserved(session, job_id, worker, 4242, 4242)


def test_a_reserved_job_keeps_its_place_and_is_no_one_elses(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    first, other, second, third = (submit(stores, settings, "alpha") for _ in range(4))
    assert lease(stores, settings, "w1") == first
    assert lease(stores, settings, "w2") == other
    assert reserve(stores, settings, "w1") == second
    reserved = row(stores, second)
    assert (reserved.state, reserved.attempts, reserved.workdir) == ("queued", 0, "/w")
    # another busy worker reserving its next job skips it and takes the job behind it
    assert reserve(stores, settings, "w2") == third
    # the reservation is a lease: the first worker's heartbeat renews it
    with stores.ops_session() as session:
        assert reservations.renew(session, settings, second, "w1")
        assert not reservations.renew(session, settings, second, "w2")
    finish(stores, first, "w1")
    start(stores, second, "w1")
    started = row(stores, second)
    assert (started.state, started.attempts, started.worker) == ("running", 1, "w1")
    assert started.started_at is not None and started.leased_at is not None
    with stores.ops_session() as session:
        lease_row = repo.lease_of(session, second)
        assert lease_row is not None and lease_row.pid == 4242


def test_a_worker_is_one_gpu_for_the_peak_budget(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha", budget_concurrent_gpus=1)
    running, nxt, other = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    # its own next job fits: its GPU passes from one job to the next
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        assert repo.active_count(session, None) == 1
        assert repo.active_count(session, None, besides_worker="w1") == 0
    # a second worker does not get a GPU for the project
    assert lease(stores, settings, "w2") is None
    assert "peak budget" in (row(stores, other).wait_reason or "")
    # nor a reservation: w2 holds nothing, and w1 already uses the project's one GPU
    assert reserve(stores, settings, "w2") is None


def test_the_global_peak_budget_counts_a_reserving_worker_once(
    stores: Stores, settings: Settings
) -> None:
    capped = settings.model_copy(update={"budget_concurrent_gpus": 1})
    make_project(stores, "alpha")
    ids = [submit(stores, capped, "alpha") for _ in range(3)]
    assert lease(stores, capped, "w1") == ids[0]
    assert reserve(stores, capped, "w1") == ids[1]
    assert lease(stores, capped, "w2") is None


def test_a_job_cancelled_while_reserved_is_dropped(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    running, nxt = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        jobs.cancel(session, nxt, "someone")
    assert row(stores, nxt).state == "cancelled"
    with pytest.raises(jobs.LeaseLost, match="cancelled"):
        start(stores, nxt, "w1")
    with stores.ops_session() as session:
        assert not reservations.renew(session, settings, nxt, "w1")
        assert repo.lease_of(session, nxt) is None  # dropped at the renewal
    assert row(stores, nxt).state == "cancelled"


def test_a_lapsed_reservation_returns_to_the_queue_unspent(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    running, nxt = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    expire_lease(stores, nxt)
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert nxt in reaped.requeued
    back = row(stores, nxt)
    assert (back.state, back.attempts) == ("queued", 0)
    # the worker that lost it cannot start it; another worker leases it, first in line
    with pytest.raises(jobs.LeaseLost):
        start(stores, nxt, "w1")
    assert lease(stores, settings, "w2") == nxt


def test_a_released_reservation_is_first_in_line_again(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    running, nxt, later = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        reservations.release(session, nxt, "w2")  # not its own: nothing happens
        assert session.query(Lease).filter(Lease.job_id == nxt).count() == 1
        reservations.release(session, nxt, "w1")
    assert lease(stores, settings, "w2") == nxt
    assert lease(stores, settings, "w3") == later


def test_a_job_just_prepared_is_left_for_an_idle_worker(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    running, fresh = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    # ready for less than gpu_reserve_after_s: an idle worker's doorbell may be on its way
    assert reserve(stores, settings, "w1", after_s=60) is None
    assert lease(stores, settings, "w2") == fresh
    # one that waited that long has no idle GPU to go to
    later = submit(stores, settings, "alpha")
    with stores.ops_session() as session:
        session.execute(
            update(JobPreparation)
            .where(JobPreparation.job_id == later)
            .values(finished_at=jobs.utcnow() - timedelta(seconds=61))
        )
    assert reserve(stores, settings, "w1", after_s=60) == later


def test_a_job_cancelled_while_reserved_stays_cancelled_whatever_ran(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    running, nxt = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        jobs.cancel(session, nxt, "someone")
    # the worker had already handed it over: its start is refused, and the outcome it then
    # reports does not overwrite the cancellation
    with pytest.raises(jobs.LeaseLost):
        start(stores, nxt, "w1")
    with stores.ops_session() as session:
        jobs.finish(session, nxt, "w1", jobs.JobOutcome(ended=End.FAILED, error="killed"))
        assert repo.lease_of(session, nxt) is None
    after = row(stores, nxt)
    assert (after.state, after.error, after.cancelled_by) == ("cancelled", None, "someone")


def test_an_idle_worker_takes_over_a_reservation_first_in_line(
    stores: Stores, settings: Settings
) -> None:
    """A reservation saves its worker a round trip; it never keeps a job from an idle GPU."""
    make_project(stores, "alpha")
    running, nxt, later = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    # w2 is idle: the reserved job is first in line, so it is w2's now, leased once
    assert lease(stores, settings, "w2") == nxt
    taken = row(stores, nxt)
    assert (taken.state, taken.worker, taken.attempts) == ("leased", "w2", 1)
    with stores.ops_session() as session:
        lease_row = repo.lease_of(session, nxt)
        assert lease_row is not None and lease_row.worker == "w2"
        # the reserver learns it at its next renewal, or when it tries to start it
        assert not reservations.renew(session, settings, nxt, "w1")
    with pytest.raises(jobs.LeaseLost, match="no longer reserved"):
        start(stores, nxt, "w1")
    assert row(stores, nxt).worker == "w2"
    # and leases the next job in line when its own ends
    finish(stores, running, "w1")
    assert lease(stores, settings, "w1") == later


def test_a_reserved_job_its_worker_started_is_not_taken_over(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    running, nxt, later = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    finish(stores, running, "w1")
    start(stores, nxt, "w1")
    assert lease(stores, settings, "w2") == later
    with stores.ops_session() as session:
        lease_row = repo.lease_of(session, nxt)
        assert lease_row is not None and lease_row.worker == "w1"
    assert (row(stores, nxt).state, row(stores, nxt).attempts) == ("running", 1)


def confirm(stores: Stores, job_id: int, worker: str = "w1") -> bool:
    with stores.ops_session() as session:
        return reservations.confirm(session, job_id, worker)


def test_a_reserved_job_runs_on_one_worker_whichever_wins(
    stores: Stores, settings: Settings
) -> None:
    """The reserver makes the job its own (`confirm`) before anything of it starts, and an idle
    worker's takeover claims it: both are conditional updates of a queued job, so exactly one
    wins, and the loser never starts it."""
    make_project(stores, "alpha")
    running, first, second, later = (submit(stores, settings, "alpha") for _ in range(4))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == first
    # the takeover first: the reserver's confirm fails, so it starts nothing
    assert lease(stores, settings, "w2") == first
    assert not confirm(stores, first, "w1")
    assert (row(stores, first).state, row(stores, first).worker) == ("leased", "w2")
    finish(stores, running, "w1")
    # the confirm first: the job is the reserver's, and an idle worker takes the next one
    assert lease(stores, settings, "w1") == second
    assert reserve(stores, settings, "w1") == later
    finish(stores, second, "w1")
    assert confirm(stores, later, "w1")
    with stores.ops_session() as session:
        # a last renewal of the reservation by the ended job's heartbeat keeps it
        assert reservations.renew(session, settings, later, "w1")
    assert lease(stores, settings, "w3") is None
    start(stores, later, "w1")
    done = row(stores, later)
    assert (done.state, done.worker, done.attempts) == ("running", "w1", 1)


def test_a_job_cancelled_while_reserved_is_not_confirmed(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    running, nxt = submit(stores, settings, "alpha"), submit(stores, settings, "alpha")
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        jobs.cancel(session, nxt, "someone")
    assert not confirm(stores, nxt, "w1")
    with stores.ops_session() as session:
        assert repo.lease_of(session, nxt) is None
