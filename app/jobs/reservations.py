"""Reservations: the job a GPU worker runs next, leased while its current job runs.

A worker reserves its next job at its current job's first line: the job moves to `reserved`
and gets a lease row, in one transaction (it keeps its place in the submission order, is not
yet running, and an idle worker of the same host may still take it over: `service.lease_next`).
When the current job ends, the worker hands the reserved job to its parked interpreter at once,
unless the host's claim on it (`workers/gpu/claims.py`) says an idle worker took it, and only
then records, in one transaction, the finished job's outcome and the reserved job's start
(`start_reserved`): no DB round trip on the GPU's idle gap.

A reservation is a lease: its worker renews it with its running job's heartbeat, and the reaper
returns a lapsed one to the queue (`queued` again, attempts unchanged: it never ran). One the
worker cannot use is released (`release`: `queued` again), and one cancelled while reserved is
dropped at the next renewal.
Budgets count a worker once, whether it holds a running job, a reservation or both
(`repository.active_count`).
"""

from __future__ import annotations

import socket
from datetime import timedelta

from sqlalchemy.orm import Session

from app.clock import utcnow
from app.jobs import gang_repository as gang_repo
from app.jobs import gangs, lifecycle
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.choosing import choose_next
from app.jobs.lifecycle import JobState
from app.jobs.models import Job, Lease
from app.settings import Settings


def reserve_next(
    session: Session,
    settings: Settings,
    *,
    queue: str,
    worker: str,
    device: str,
    host: str | None = None,
    alive: gangs.Alive | None = None,
) -> Job | None:
    """Reserve the job that `lease_next` would give `worker` now, budgets counted as if the
    worker's current job had ended (its GPU passes to this one); None when none fits.

    Only a job ready for `gpu_reserve_after_s` is taken: a job an idle worker of the host could
    run is leased by it within its doorbell's latency, so one still waiting after that has no
    idle GPU to go to. (A reservation holds its job until the reserving worker's current job
    ends: it must never keep a job from an idle GPU.) With `alive`, nothing is reserved while
    another worker of the host is idle: the workers of a job of several GPUs that just ended
    are idle at once, and a job ready long before is theirs, not the busy worker's. The leader
    of a job of several GPUs reserves nothing: when its job ends, the host's free GPUs are for
    whatever the line gives them then.
    """
    host = host or socket.gethostname()
    repo.lock_leasing(session)
    if gang_repo.leads_gang(session, worker):
        # Its job's end frees all of that job's GPUs at once: the moment a job of several
        # GPUs close behind in line (`gang_window`) can start, which a reservation would take.
        session.flush()
        return None
    if alive is not None:
        idle = gangs.HostRoom.of(
            session, host=host, kind=queue.removeprefix("gpu."), asking=worker, alive=alive
        )
        if idle.free:
            session.flush()
            return None
    ready_before = utcnow() - timedelta(seconds=settings.gpu_reserve_after_s)
    job = choose_next(
        session,
        settings,
        queue=queue,
        host=host,
        besides_worker=worker,
        ready_before=ready_before,
    )
    if job is None:
        session.flush()
        return None
    # Its state goes in the UPDATE that records where it runs (`add_lease`): one write. Under the
    # leasing lock (and, on PostgreSQL, `leasable`'s row lock) no one else moves it meanwhile.
    lifecycle.move(job, JobState.RESERVED, wait_reason=None)
    jobs.add_lease(session, settings, job, worker=worker, host=host, device=device)
    return job


def start_reserved(
    session: Session, job_id: int, worker: str, pid: int | None, pgid: int | None
) -> Job:
    """The reserved job has been handed over (pid, pgid): mark it running and the worker's own.

    Raises LeaseLost when the reservation is no longer the worker's (it lapsed and another
    worker took the job) or the job was cancelled meanwhile: the caller kills what it started.
    """
    lease = repo.lease_of(session, job_id)
    if lease is None or lease.worker != worker:
        raise jobs.LeaseLost(f"job {job_id} is no longer reserved by {worker}")
    if not repo.promote(session, job_id, worker, utcnow()):
        raise jobs.LeaseLost(f"job {job_id} was cancelled while reserved by {worker}")
    lease.pid, lease.pgid = pid, pgid
    job = jobs.get(session, job_id)
    repo.refresh(session, job)
    jobs.set_current_job(session, worker, job_id)
    session.flush()
    return job


def renew(session: Session, settings: Settings, job_id: int, worker: str) -> bool:
    """Extend the reservation with the running job's heartbeat; False (and the reservation
    dropped) when it is no longer the worker's or the job no longer waits for it."""
    lease = repo.lease_of(session, job_id)
    if lease is None or lease.worker != worker:
        return False
    job = jobs.get(session, job_id)
    if job.state != JobState.RESERVED or job.cancel_requested_at is not None:
        repo.delete(session, lease)
        session.flush()
        return False
    now = utcnow()
    lease.heartbeat_at = now
    lease.expires_at = now + timedelta(seconds=settings.lease_ttl_s)
    session.flush()
    return True


def release(session: Session, job_id: int, worker: str) -> None:
    """Give a reservation back: the job waits in its place in the queue again."""
    lease = repo.lease_of(session, job_id)
    if lease is not None and lease.worker == worker:
        job = repo.get(session, job_id)
        if job is not None and job.state == JobState.RESERVED:
            give_back(session, job, lease)
            session.flush()


def give_back(session: Session, job: Job, lease: Lease) -> None:
    """The reserved job waits in its place in line again (released, or its reservation lapsed:
    it never ran, so its attempts stand); its lease goes."""
    repo.delete(session, lease)
    lifecycle.move(job, JobState.QUEUED)
