"""Reservations (app/jobs/reservations.py) on the real stores: a worker's next job, leased while
its current job runs. Its place in the order, the budgets, cancellation, the reaper, release."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from app.db import Stores
from app.jobs import figures, reaping, reservations
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.jobs.models import Job, JobPreparation, Lease
from app.settings import Settings
from tests.integration.queue.test_jobs_service import (
    expire_lease,
    finish,
    lease,
    make_project,
    row,
    submit,
)
from workers.gpu.claims import Claims

# Both stacks: reservations and takeovers are conditional updates that race.
pytestmark = pytest.mark.stores("sqlite", "postgres")


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
    assert (reserved.state, reserved.attempts, reserved.workdir) == ("reserved", 0, "/w")
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


def test_a_reservation_writes_the_jobs_state_with_its_lease(
    stores: Stores, settings: Settings
) -> None:
    """A reserved job is `reserved` in the ops DB as soon as the reservation commits (one
    transaction, no second write), is listed and counted as such, and still waits: no log, no
    start, its cycle still queued."""
    make_project(stores, "alpha")
    running, nxt = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        job = repo.get(session, nxt)
        lease_row = repo.lease_of(session, nxt)
        assert job is not None and lease_row is not None
        assert (job.state, lease_row.worker, job.started_at) == ("reserved", "w1", None)
        assert [j.id for j in jobs.list_jobs(session, state="reserved")] == [nxt]
        assert jobs.list_jobs(session, state="queued") == []
        assert repo.waiting_without_doorbell(session, jobs.utcnow() + timedelta(hours=1)) == []
        summary = {q["queue"]: q for q in figures.queues(session, settings)}
        cpu = summary["gpu.cpu"]
        assert (cpu["queued"], cpu["reserved"], cpu["leased"]) == (0, 1, 1)
        assert cpu["oldest_queued_at"] is not None  # a reserved job still waits


def test_a_reservation_that_does_not_commit_leaves_the_job_queued(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    running, nxt = (submit(stores, settings, "alpha") for _ in range(2))
    assert lease(stores, settings, "w1") == running
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    seen: list[str] = []

    def reserve_then_refuse() -> None:
        with stores.ops_session() as session:
            job = reservations.reserve_next(
                session, at_once, queue="gpu.cpu", worker="w1", device=""
            )
            seen.append(job.state if job else "none")
            raise RuntimeError("too late for it")  # the worker's deadline, say: rolled back

    with pytest.raises(RuntimeError):
        reserve_then_refuse()
    assert seen == ["reserved"]
    still = row(stores, nxt)
    assert (still.state, still.attempts) == ("queued", 0)
    with stores.ops_session() as session:
        assert repo.lease_of(session, nxt) is None


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
    assert row(stores, nxt).state == "reserved"
    with stores.ops_session() as session:
        reservations.release(session, nxt, "w1")
    given_back = row(stores, nxt)
    assert (given_back.state, given_back.attempts) == ("queued", 0)
    with pytest.raises(jobs.LeaseLost):  # no longer its worker's to hand over
        start(stores, nxt, "w1")
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


class Host:
    """The claims of reserved jobs on this host (workers/gpu/claims.py), as its workers use them."""

    def __init__(self, root: Path) -> None:
        self.claims = Claims(root)

    def lease(self, stores: Stores, settings: Settings, worker: str) -> int | None:
        """`lease_next` as an idle worker of the host leases: it may take a reservation over."""

        def may_take(job: Job, reservation: Lease) -> bool:
            return self.claims.take(job.id, job.attempts, reservation.worker)

        with stores.ops_session() as session:
            job = jobs.lease_next(
                session, settings, queue="gpu.cpu", worker=worker, device="", may_take=may_take
            )
            return job.id if job else None

    def start(self, job_id: int, attempt: int, reserver: str) -> bool:
        """The reserver's side, at its current job's end, before it starts the job."""
        return self.claims.start(job_id, attempt, reserver)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def test_an_idle_worker_takes_over_a_reservation_first_in_line(
    stores: Stores, settings: Settings, host: Host
) -> None:
    """A reservation saves its worker a round trip; it never keeps a job from an idle GPU."""
    make_project(stores, "alpha")
    running, nxt, later = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    # w2 is idle: the reserved job is first in line, so it is w2's now, leased once
    assert host.lease(stores, settings, "w2") == nxt
    taken = row(stores, nxt)
    assert (taken.state, taken.worker, taken.attempts) == ("leased", "w2", 1)
    with stores.ops_session() as session:
        lease_row = repo.lease_of(session, nxt)
        assert lease_row is not None and lease_row.worker == "w2"
        # the reserver learns it at its next renewal
        assert not reservations.renew(session, settings, nxt, "w1")
    # or when its own job ends: the host's claim says it was taken, so it starts nothing
    assert not host.start(nxt, 0, "w1")
    with pytest.raises(jobs.LeaseLost, match="no longer reserved"):
        start(stores, nxt, "w1")
    assert row(stores, nxt).worker == "w2"
    # and leases the next job in line when its own ends
    finish(stores, running, "w1")
    assert lease(stores, settings, "w1") == later


def test_a_reserved_job_its_worker_starts_is_not_taken_over(
    stores: Stores, settings: Settings, host: Host
) -> None:
    """The reserver's start at its job's end comes first: an idle worker takes the next job,
    before and after the start is in the ops DB; without the host's claims it takes none."""
    make_project(stores, "alpha")
    running, nxt, later, last = (submit(stores, settings, "alpha") for _ in range(4))
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    assert lease(stores, settings, "w3") == later  # no claims: a reserved job is passed over
    finish(stores, running, "w1")
    assert host.start(nxt, 0, "w1")  # handed to its interpreter: the DB still says reserved
    assert row(stores, nxt).state == "reserved"
    assert host.lease(stores, settings, "w2") == last
    start(stores, nxt, "w1")
    with stores.ops_session() as session:
        lease_row = repo.lease_of(session, nxt)
        assert lease_row is not None and lease_row.worker == "w1"
    assert (row(stores, nxt).state, row(stores, nxt).attempts) == ("running", 1)


def test_a_reservation_on_another_host_is_not_taken_over(
    stores: Stores, settings: Settings, host: Host
) -> None:
    """The claim is a file of the reserver's host: a worker elsewhere leaves its jobs alone."""
    make_project(stores, "alpha")
    running, nxt = submit(stores, settings, "alpha"), submit(stores, settings, "alpha")
    assert lease(stores, settings, "w1") == running
    assert reserve(stores, settings, "w1") == nxt
    with stores.ops_session() as session:
        session.execute(update(Lease).where(Lease.job_id == nxt).values(host="elsewhere"))
    assert host.lease(stores, settings, "w2") is None
    assert row(stores, nxt).state == "reserved"


def test_the_claims_of_a_reservation_race_on_one_lock(tmp_path: Path) -> None:
    """Whichever of the reserver's start and an idle worker's takeover writes first wins, in
    any interleaving of processes: many pairs raced, never both, never neither."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        for job_id in range(40):
            start_ = pool.apply_async(_race, (tmp_path, "start", job_id))
            take_ = pool.apply_async(_race, (tmp_path, "take", job_id))
            assert start_.get(timeout=30) != take_.get(timeout=30), job_id
    # a later reservation of the same job (a new attempt) is decided afresh
    claims = Claims(tmp_path)
    assert claims.take(100, 0, "w1") and not claims.start(100, 0, "w1")
    assert claims.start(100, 1, "w1") and not claims.take(100, 1, "w1")
    claims.forget(100, 1, "w1")
    assert claims.take(100, 1, "w1")


def _race(root: Path, side: str, job_id: int) -> bool:
    claims = Claims(root)
    return claims.start(job_id, 0, "w1") if side == "start" else claims.take(job_id, 0, "w1")


def test_old_claims_are_swept(tmp_path: Path) -> None:
    import os
    import time

    claims = Claims(tmp_path)
    assert claims.start(1, 0, "w1") and claims.take(2, 0, "w1")
    old = time.time() - 7200
    os.utime(claims.path(1, 0, "w1"), (old, old))
    assert claims.sweep(3600) == 1
    assert not claims.path(1, 0, "w1").exists() and claims.path(2, 0, "w1").exists()


def test_a_reservation_unrenewed_for_about_a_lease_is_not_started(
    stores: Stores, settings: Settings
) -> None:
    """A reservation whose renewals failed may have lapsed and gone to another worker: at its
    turn the reserver gives it back instead of starting it (no DB round trip to ask)."""
    from workers.gpu.reservation import Reservation, State
    from workers.gpu.tickets import WorkerIdentity

    make_project(stores, "alpha")
    running, first, second = (submit(stores, settings, "alpha") for _ in range(3))
    me = WorkerIdentity(name="w1", kind="cpu", device="")
    assert lease(stores, settings, me.name) == running
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    nxt = Reservation(stores, at_once, me, spares=None, discard=lambda _: None)  # type: ignore[arg-type]
    reserved = nxt.reserve()
    assert reserved is not None and reserved.job_id == first
    taken = nxt.take()  # renewed just now: its turn, it is this worker's to start
    assert taken is not None and taken.job_id == first
    start(stores, first, me.name)
    nxt.closed(taken, State.STARTED)  # as its run does once its start is recorded
    finish(stores, running, me.name)
    reserved = nxt.reserve()
    assert reserved is not None and reserved.job_id == second
    nxt._renewed -= at_once.lease_ttl_s  # its renewals failed for a lease's time
    assert nxt.take() is None
    with stores.ops_session() as session:
        assert repo.lease_of(session, second) is None  # given back: first in line again
    assert row(stores, second).state == "queued"
