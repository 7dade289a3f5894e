"""The queries of gang jobs' seats and of the workers and leases of one host (app/jobs/gangs.py)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from app.jobs.lifecycle import WAITING
from app.jobs.models import GangSeat, Job, Lease, Worker


def seat_of(session: Session, worker: str) -> GangSeat | None:
    """The gang seat `worker` holds, if any: a seated worker leases nothing else."""
    return session.scalars(select(GangSeat).where(GangSeat.worker == worker)).one_or_none()


def leads_gang(session: Session, worker: str) -> bool:
    """Whether `worker` holds the lease of a job of several GPUs (it is that job's leader)."""
    found = session.scalars(
        select(Lease.id)
        .join(Job, Job.id == Lease.job_id)
        .where(Lease.worker == worker, Job.gpus > 1)
        .limit(1)
    ).first()
    return found is not None


def gpus_in_line(session: Session, queue: str, limit: int) -> Sequence[int]:
    """The GPUs of the first `limit` jobs waiting on `queue`, in line order (prepared or not,
    reserved or not)."""
    return session.scalars(
        select(Job.gpus)
        .where(Job.queue == queue, Job.state.in_(WAITING), Job.cancel_requested_at.is_(None))
        .order_by(Job.order_key, Job.id)
        .limit(limit)
    ).all()


def seats(session: Session, job_id: int) -> Sequence[GangSeat]:
    return session.scalars(select(GangSeat).where(GangSeat.job_id == job_id)).all()


def release(session: Session, job_id: int) -> None:
    """The job's seats go (its lease went, or goes, with them)."""
    session.execute(
        delete(GangSeat)
        .where(GangSeat.job_id == job_id)
        .execution_options(synchronize_session=False)
    )


def seated_workers(session: Session) -> dict[str, int]:
    """Every seated worker, with the job it is seated in."""
    return {seat.worker: seat.job_id for seat in session.scalars(select(GangSeat))}


def workers_on(session: Session, host: str, kind: str) -> Sequence[Worker]:
    return session.scalars(select(Worker).where(Worker.host == host, Worker.kind == kind)).all()


def workers_named(session: Session, names: Sequence[str]) -> Sequence[Worker]:
    return session.scalars(select(Worker).where(Worker.name.in_(names))).all()


def holders_on(session: Session, host: str) -> list[tuple[str, Job, bool]]:
    """(worker, its job, seated) of each lease and gang seat on `host`."""
    leased = session.execute(
        select(Lease.worker, Job).join(Job, Job.id == Lease.job_id).where(Lease.host == host)
    ).all()
    seated = session.execute(
        select(GangSeat.worker, Job)
        .join(Job, Job.id == GangSeat.job_id)
        .where(GangSeat.host == host)
    ).all()
    return [(w, j, False) for w, j in leased] + [(w, j, True) for w, j in seated]
