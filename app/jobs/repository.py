"""All SQL of the GPU handoff queue: jobs, leases, workers. Only flushes; the caller commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, case, func, select, update
from sqlalchemy.orm import Session

from app.jobs import lifecycle
from app.jobs.lifecycle import ACTIVE, FINISHED, WAITING, JobState
from app.jobs.models import GangSeat, Job, JobPreparation, Lease, QueueLock, Worker

#: The two moves that race other writers, as conditional UPDATEs (the lifecycle checks them).
#: A claim takes a waiting job, or takes a reserved one over (`service.lease_next`).
_CLAIM = lifecycle.guarded((JobState.QUEUED, JobState.RESERVED), JobState.LEASED)
_PROMOTE = lifecycle.guarded(JobState.RESERVED, JobState.RUNNING)


def get(session: Session, job_id: int) -> Job | None:
    return session.get(Job, job_id)


def add(session: Session, row: Job | Lease | Worker | JobPreparation | GangSeat) -> None:
    session.add(row)


def delete(session: Session, row: Lease | JobPreparation) -> None:
    session.delete(row)


def refresh(session: Session, row: Job) -> None:
    """Re-read a row a conditional update just changed behind the session's back."""
    session.refresh(row)


def lock_leasing(session: Session) -> None:
    """Take the leasing lock: a write first, so SQLite starts its write transaction now and
    PostgreSQL holds the row lock until commit. Leasers are serialised; budgets stay exact."""
    session.execute(
        update(QueueLock).where(QueueLock.name == "lease").values(counter=QueueLock.counter + 1)
    )


def _waiting(queue: str, reserved_too: bool = False) -> list[ColumnElement[bool]]:
    """Prepared jobs of `queue` waiting for a GPU; `reserved_too`: with those that busy workers
    reserved (reservations.py)."""
    return [
        Job.queue == queue,
        Job.state.in_(WAITING) if reserved_too else Job.state == JobState.QUEUED,
        Job.prepared_at.is_not(None),
        Job.cancel_requested_at.is_(None),
    ]


def _ready_on(host: str, before: datetime | None = None) -> ColumnElement[bool]:
    """The job has a finished preparation on `host` (finished `before`, if given): a worker
    there may lease it."""
    query = select(JobPreparation.id).where(
        JobPreparation.job_id == Job.id,
        JobPreparation.host == host,
        JobPreparation.state == "ready",
    )
    if before is not None:
        query = query.where(JobPreparation.finished_at <= before)
    return query.exists()


def leasable(
    session: Session,
    queue: str,
    limit: int = 20,
    exclude_projects: Sequence[int] = (),
    host: str | None = None,
    ready_before: datetime | None = None,
    reserved_too: bool = False,
) -> Sequence[Job]:
    """The first `limit` jobs waiting on `queue` in line order; `reserved_too`: with those
    reserved by busy workers (an idle worker may take them over, `service.lease_next`)."""
    query: Select[Job] = select(Job).where(*_waiting(queue, reserved_too))
    if host is not None:
        query = query.where(_ready_on(host, ready_before))
    if exclude_projects:
        query = query.where(Job.project_id.not_in(exclude_projects))
    query = query.order_by(Job.order_key, Job.id).limit(limit)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=True)
    return session.scalars(query).all()


def first_waiting(session: Session, queue: str, host: str | None = None) -> Job | None:
    """The prepared job first in line on `queue` (on `host`), read without a lock: a hint."""
    query = select(Job).where(*_waiting(queue))
    if host is not None:
        query = query.where(_ready_on(host))
    return session.scalars(query.order_by(Job.order_key, Job.id).limit(1)).first()


# -- each host's preparation ----------------------------------------------------------------


def preparation(session: Session, job_id: int, host: str) -> JobPreparation | None:
    return session.scalars(
        select(JobPreparation).where(JobPreparation.job_id == job_id, JobPreparation.host == host)
    ).one_or_none()


def preparations(session: Session, job_id: int) -> Sequence[JobPreparation]:
    return session.scalars(
        select(JobPreparation).where(JobPreparation.job_id == job_id).order_by(JobPreparation.id)
    ).all()


def preparations_in_progress(session: Session, job_ids: Sequence[int]) -> Sequence[JobPreparation]:
    """The preparations still running of these jobs, on any host."""
    if not job_ids:
        return []
    return session.scalars(
        select(JobPreparation)
        .where(JobPreparation.job_id.in_(list(job_ids)), JobPreparation.state == "preparing")
        .order_by(JobPreparation.id)
    ).all()


def unprepared_on(session: Session, queue: str, host: str, limit: int) -> Sequence[int]:
    """Waiting jobs of `queue` (reserved ones too) that `host` has neither prepared nor failed,
    oldest first (one being prepared there is included: its preparer may have died, and the
    host's lock tells)."""
    tried = (
        select(JobPreparation.id)
        .where(
            JobPreparation.job_id == Job.id,
            JobPreparation.host == host,
            JobPreparation.state.in_(("ready", "failed")),
        )
        .exists()
    )
    return session.scalars(
        select(Job.id)
        .where(
            Job.queue == queue,
            Job.state.in_(WAITING),
            Job.cancel_requested_at.is_(None),
            ~tried,
        )
        .order_by(Job.order_key, Job.id)
        .limit(limit)
    ).all()


def ready_count_on(session: Session, queue: str, host: str) -> int:
    """Queued jobs of `queue` prepared on `host` (not leased, nor reserved)."""
    return int(
        session.scalar(
            select(func.count()).select_from(Job).where(*_waiting(queue), _ready_on(host))
        )
        or 0
    )


def hosts_seen_since(session: Session, kind: str, since: datetime) -> set[str]:
    """The hosts with a worker of `kind` that reported since `since`."""
    return set(
        session.scalars(
            select(Worker.host).where(Worker.kind == kind, Worker.last_seen >= since).distinct()
        ).all()
    )


def set_wait_reason(
    session: Session, queue: str, reason: str, *, project_id: int | None = None
) -> None:
    """Show why the prepared jobs of `queue` (of one project, or all) wait."""
    query = update(Job).where(*_waiting(queue))
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    session.execute(
        query.values(wait_reason=reason[:255]).execution_options(synchronize_session=False)
    )


def set_job_wait_reason(session: Session, job_id: int, reason: str) -> None:
    """Show why one waiting job waits (a job of several GPUs, or one held back for it)."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state == JobState.QUEUED)
        .values(wait_reason=reason[:255])
        .execution_options(synchronize_session=False)
    )


def clear_wait_reasons(session: Session, queue: str, keep_projects: Sequence[int] = ()) -> None:
    """A reason that no longer holds is cleared (the job waits only for its turn now)."""
    query = update(Job).where(*_waiting(queue), Job.wait_reason.is_not(None))
    if keep_projects:
        query = query.where(Job.project_id.not_in(keep_projects))
    session.execute(query.values(wait_reason=None).execution_options(synchronize_session=False))


def claim(session: Session, job_id: int, worker: str, now: datetime) -> bool:
    """The conditional update that makes a lease: only a still-queued job can be claimed."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state.in_(_CLAIM.frm))
        .values(
            **_CLAIM.assign,
            leased_at=now,
            worker=worker,
            attempts=Job.attempts + 1,
            wait_reason=None,
        )
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined, no-any-return]


def lease_of(session: Session, job_id: int) -> Lease | None:
    return session.scalars(select(Lease).where(Lease.job_id == job_id)).one_or_none()


def expired_leases(session: Session, now: datetime) -> Sequence[Lease]:
    return session.scalars(select(Lease).where(Lease.expires_at < now)).all()


def active_count(
    session: Session, project_id: int | None = None, besides_worker: str | None = None
) -> int:
    """GPUs in use (of `project_id`'s jobs): active jobs, plus workers holding a reservation
    and no active job in scope. A worker is one GPU: its running job and the one it reserved
    count once. `besides_worker` leaves that worker out (it asks for its own next job)."""
    active = select(Job.worker).where(Job.state.in_(ACTIVE))
    reserving = (
        select(Lease.worker).join(Job, Job.id == Lease.job_id).where(Job.state == JobState.RESERVED)
    )
    if project_id is not None:
        active = active.where(Job.project_id == project_id)
        reserving = reserving.where(Job.project_id == project_id)
    if besides_worker is not None:
        active = active.where(func.coalesce(Job.worker, "") != besides_worker)
        reserving = reserving.where(Lease.worker != besides_worker)
    busy = session.scalar(select(func.count()).select_from(active.subquery())) or 0
    holding = set(session.scalars(reserving)) - set(session.scalars(active))
    # A job of several GPUs: its leader is the active job's worker, its members are seated.
    seated = select(func.count(GangSeat.id)).join(Job, Job.id == GangSeat.job_id)
    if project_id is not None:
        seated = seated.where(Job.project_id == project_id)
    return busy + len(holding) + (session.scalar(seated) or 0)


def promote(session: Session, job_id: int, worker: str, now: datetime) -> bool:
    """The conditional update that starts a reserved job: only if it is still reserved (not
    given back, taken over or cancelled) and no one asked to cancel it (a cancelled
    reservation is the worker's to drop)."""
    result = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.state.in_(_PROMOTE.frm), Job.cancel_requested_at.is_(None))
        .values(
            **_PROMOTE.assign,
            leased_at=now,
            started_at=now,
            worker=worker,
            attempts=Job.attempts + 1,
            wait_reason=None,
        )
        .execution_options(synchronize_session=False)
    )
    return result.rowcount == 1  # type: ignore[attr-defined, no-any-return]


def unfinished_standalone(session: Session, project_id: int) -> int:
    """The project's jobs submitted on their own (no cycle) that have not finished."""
    query = (
        select(func.count())
        .select_from(Job)
        .where(Job.project_id == project_id, Job.cycle_id.is_(None), Job.state.not_in(FINISHED))
    )
    return session.scalar(query) or 0


def gpu_seconds_since(session: Session, since: datetime, project_id: int | None = None) -> float:
    """GPU seconds used in the window: finished jobs plus the elapsed part of running ones."""
    finished = select(func.coalesce(func.sum(Job.gpu_seconds), 0.0)).where(Job.finished_at >= since)
    running = select(Job.started_at).where(
        Job.state == JobState.RUNNING, Job.started_at.is_not(None)
    )
    if project_id is not None:
        finished = finished.where(Job.project_id == project_id)
        running = running.where(Job.project_id == project_id)
    total = float(session.scalar(finished) or 0.0)
    now = datetime.now(since.tzinfo)
    for started in session.scalars(running):
        if started is not None:
            total += max(0.0, (now - _aware(started, since)).total_seconds())
    return total


def _aware(value: datetime, like: datetime) -> datetime:
    # SQLite returns naive datetimes for timezone-aware columns; they are UTC.
    return value if value.tzinfo else value.replace(tzinfo=like.tzinfo)


def waiting_without_doorbell(session: Session, older_than: datetime) -> Sequence[Job]:
    """Queued jobs that have waited long enough that their doorbell may have been lost."""
    return session.scalars(
        select(Job)
        .where(
            Job.state == JobState.QUEUED,  # not a reserved one: its worker runs it next
            func.coalesce(Job.prepared_at, Job.submitted_at) < older_than,
        )
        .order_by(Job.order_key, Job.id)
        .limit(500)
    ).all()


def list_jobs(
    session: Session,
    *,
    queue: str | None = None,
    state: str | None = None,
    project_id: int | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Sequence[Job]:
    query = _jobs_where(select(Job), queue, state, project_id)
    return session.scalars(query.order_by(Job.id.desc()).limit(limit).offset(offset)).all()


def count_jobs(
    session: Session,
    *,
    queue: str | None = None,
    state: str | None = None,
    project_id: int | None = None,
) -> int:
    query = _jobs_where(select(func.count()).select_from(Job), queue, state, project_id)
    return session.scalar(query) or 0


def _jobs_where(
    query: Select[Any], queue: str | None, state: str | None, project_id: int | None
) -> Select[Any]:
    if queue:
        query = query.where(Job.queue == queue)
    if state:
        query = query.where(Job.state == state)
    if project_id is not None:
        query = query.where(Job.project_id == project_id)
    return query


def queue_summary(session: Session) -> list[tuple[str, str, int, datetime | None]]:
    rows = session.execute(
        select(Job.queue, Job.state, func.count(), func.min(Job.submitted_at))
        .where(Job.state.in_((*WAITING, *ACTIVE)))
        .group_by(Job.queue, Job.state)
    ).all()
    return [(q, s, int(n), oldest) for q, s, n, oldest in rows]


def recent_finished(session: Session, queue: str, since: datetime) -> Sequence[Job]:
    return session.scalars(
        select(Job)
        .where(and_(Job.queue == queue, Job.finished_at >= since, Job.started_at.is_not(None)))
        .order_by(Job.finished_at)
    ).all()


def kept_among(session: Session, ids: Sequence[int], before: datetime) -> set[int]:
    """Those of `ids` whose job is not finished, or finished after `before` (an id with no row,
    a job deleted with its project, is not among them)."""
    done = and_(Job.state.in_(FINISHED), Job.finished_at.is_not(None), Job.finished_at <= before)
    return set(session.scalars(select(Job.id).where(Job.id.in_(ids), ~done)).all())


def get_worker(session: Session, name: str) -> Worker | None:
    return session.scalars(select(Worker).where(Worker.name == name)).one_or_none()


def list_workers(session: Session) -> Sequence[Worker]:
    return session.scalars(select(Worker).order_by(Worker.name)).all()


def stale_before(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


# -- figures for /metrics and `autopilot status` ---------------------------------------------


def counts_by_queue_and_state(session: Session) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    rows = session.execute(
        select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)
    )
    for queue, state, count in rows:
        counts.setdefault(queue, {})[state] = int(count)
    return counts


def duration_histogram(
    session: Session, bounds: Sequence[float]
) -> list[tuple[str, int, float, list[int]]]:
    """GPU seconds of every job that ran and finished, per queue: (queue, count, sum, cumulative
    counts of jobs at or under each bound)."""
    ran = Job.gpu_seconds
    columns = [func.sum(case((ran <= bound, 1), else_=0)) for bound in bounds]
    rows = session.execute(
        select(Job.queue, func.count(), func.coalesce(func.sum(ran), 0.0), *columns)
        .where(Job.state.in_(FINISHED), Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .group_by(Job.queue)
    )
    return [(row[0], int(row[1]), float(row[2]), [int(n or 0) for n in row[3:]]) for row in rows]


def lease_expiries(session: Session) -> dict[str, int]:
    """Leases that lapsed, per queue. A proxy: nothing counts expiries themselves, but a job is
    leased again only after its lease expired, so every attempt beyond the first is one expiry,
    plus the last one of each job the reaper gave up on."""
    extra_attempts = func.sum(case((Job.attempts > 1, Job.attempts - 1), else_=0))
    given_up = func.sum(
        case(((Job.state == "failed") & Job.error.like("lease expired%"), 1), else_=0)
    )
    rows = session.execute(select(Job.queue, extra_attempts, given_up).group_by(Job.queue))
    return {queue: int(again or 0) + int(gave_up or 0) for queue, again, gave_up in rows}


# -- asked by cycles ----


def for_cycle(session: Session, cycle_id: int) -> Job | None:
    """The job a cycle submitted (a cycle has at most one; re-validation jobs have none)."""
    return session.scalars(
        select(Job).where(Job.cycle_id == cycle_id).order_by(Job.id).limit(1)
    ).first()


def ids_for_cycles(session: Session, cycle_ids: Sequence[int]) -> dict[int, int]:
    """Each of these cycles' job id, for those that have one."""
    if not cycle_ids:
        return {}
    rows = session.execute(
        select(Job.cycle_id, Job.id)
        .where(Job.cycle_id.in_(cycle_ids))
        .order_by(Job.id.desc())  # the first job wins should there ever be two
    ).all()
    return {int(cycle_id): job_id for cycle_id, job_id in rows if cycle_id is not None}


def ended_before_for_cycles(
    session: Session, cycle_ids: Sequence[int], older_than: datetime
) -> list[tuple[int, datetime]]:
    """Of these cycles, those whose job finished before `older_than`: (cycle id, finished_at)."""
    if not cycle_ids:
        return []
    rows = session.execute(
        select(Job.cycle_id, Job.finished_at).where(
            Job.cycle_id.in_(cycle_ids),
            Job.state.in_(FINISHED),
            Job.finished_at < older_than,
        )
    ).all()
    return [(int(c), f) for c, f in rows if c is not None and f is not None]


# -- read by the dashboard ----


def change_marks(session: Session) -> tuple[object, ...]:
    """The jobs' count and latest phase times: they move whenever a job is added or moves on."""
    marks = select(
        func.count(Job.id),
        func.max(Job.submitted_at),
        func.max(Job.prepared_at),
        func.max(Job.leased_at),
        func.max(Job.first_line_at),
        func.max(Job.finished_at),
        func.max(Job.wait_reason),
    )
    return tuple(session.execute(marks).one())


def holder_marks(session: Session) -> list[tuple[object, ...]]:
    """Who holds the jobs: the leases' and the workers' count and latest job (not heartbeats)."""
    return [
        tuple(session.execute(select(func.count(Lease.id), func.max(Lease.job_id))).one()),
        tuple(
            session.execute(select(func.count(Worker.id), func.max(Worker.current_job_id))).one()
        ),
    ]
