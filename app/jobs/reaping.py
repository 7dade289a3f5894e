"""The reaper's rules: jobs whose lease lapsed go back to their queue (or fail after their last
attempt), and lost doorbells are rung again at growing intervals (docs/design.md, "Recovery:
the ops DB is the truth")."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.jobs import gangs, lifecycle, reservations
from app.jobs import repository as repo
from app.jobs.lifecycle import FINISHED, JobState
from app.jobs.models import Job, Lease
from app.jobs.service import get
from app.settings import Settings


@dataclass
class Reaped:
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    prepare_doorbells: list[int] = field(default_factory=list)  # no host has prepared these
    prepare_queues: list[str] = field(default_factory=list)  # their queues, to ring
    run_doorbells: list[str] = field(default_factory=list)  # queues to ring


#: Re-ringing backs off from `doorbell_stale_s` up to this many times it (8 min by default).
DOORBELL_BACKOFF_CAP = 16


def doorbell_due(waited_s: float, settings: Settings) -> bool:
    """Whether the reaper re-rings the doorbell of something waiting `waited_s` seconds.

    At `doorbell_stale_s`, then at 2x, 4x, 8x... that wait (then every 16x): the reaper runs every
    `reaper_interval_s`, so it sees each window [stale * 2^k, stale * 2^k + interval) about
    once. A doorbell lost to a broker restart is recovered within one stale period, while a
    long backlog (the control worker busy with hundreds of jobs) costs each waiting item a
    few doorbells in all, not one per tick.
    """
    stale = settings.doorbell_stale_s
    if waited_s < stale:
        return False
    cap = stale * DOORBELL_BACKOFF_CAP
    if waited_s >= cap:  # then every `cap` seconds: a missed window never waits for hours
        return (waited_s - cap) % cap < settings.reaper_interval_s
    window = stale * 2.0 ** math.floor(math.log2(waited_s / stale))
    return waited_s - window < settings.reaper_interval_s


def give_back(
    session: Session, job: Job, lease: Lease, failed_error: str, error: str | None = None
) -> JobState | None:
    """The job its worker lost (its lease lapsed, or a member of its gang died) goes back to its
    queue for another attempt, with `error` saying why; or is cancelled, if someone asked; or
    fails with `failed_error` after its last attempt. Its lease (and seats) go. Its new state;
    None for a job already finished (a reservation cancelled meanwhile)."""
    repo.delete(session, lease)
    if job.gpus > 1:
        gangs.release(session, job.id)  # its members go free with its leader's lease
    now = utcnow()
    if job.state in FINISHED:
        return None
    if job.cancel_requested_at is not None:
        lifecycle.move(job, JobState.CANCELLED, finished_at=now)
    elif job.attempts >= job.max_attempts:
        lifecycle.move(job, JobState.FAILED, finished_at=now, error=failed_error)
    else:
        lifecycle.move(job, JobState.QUEUED, worker=None, started_at=None, error=error)
        used = repo.preparation(session, job.id, lease.host)
        if used is not None:
            # Its export ran once and is the job's to write: a retry on that host gets a
            # fresh one (the host prepares the job again before it may lease it).
            repo.delete(session, used)
    return JobState(job.state)


def give_back_gang(session: Session, job_id: int, leader: str, reason: str) -> bool:
    """A member of the job's gang died (`gangs.lost_members`): its leader gives the job back as
    the reaper would; False when `leader` no longer holds it."""
    lease = repo.lease_of(session, job_id)
    job = repo.get(session, job_id)
    if lease is None or lease.worker != leader or job is None:
        return False
    give_back(session, job, lease, f"{reason}; giving up after {job.attempts} attempts", reason)
    session.flush()
    return True


def reap(session: Session, settings: Settings) -> Reaped:
    """Return jobs whose lease lapsed to their queue (or fail them after max attempts), and list
    the doorbells to ring again for jobs that waited too long."""
    now = utcnow()
    reaped = Reaped()
    for lease in repo.expired_leases(session, now):
        job = get(session, lease.job_id)
        if job.state == JobState.RESERVED:  # its reserver's lapsed: the job never ran
            reservations.give_back(session, job, lease)
            reaped.requeued.append(job.id)
            continue
        given = give_back(
            session,
            job,
            lease,
            f"lease expired {job.attempts} times (worker {lease.worker} on {lease.host} "
            "stopped heartbeating); giving up after max attempts",
        )
        if given == JobState.QUEUED:
            reaped.requeued.append(job.id)
        elif given == JobState.FAILED:
            reaped.failed.append(job.id)
    session.flush()
    stale = repo.stale_before(now, settings.doorbell_stale_s)
    for job in repo.waiting_without_doorbell(session, stale):
        if job.prepared_at is None:
            waited = now - (aware(job.submitted_at) or now)
            if doorbell_due(waited.total_seconds(), settings):
                reaped.prepare_doorbells.append(job.id)
                if job.queue not in reaped.prepare_queues:
                    reaped.prepare_queues.append(job.queue)
        elif job.queue not in reaped.run_doorbells:
            reaped.run_doorbells.append(job.queue)
    for job_id in reaped.requeued:
        queue = get(session, job_id).queue
        if queue not in reaped.run_doorbells:
            reaped.run_doorbells.append(queue)
    return reaped
