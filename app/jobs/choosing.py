"""Which job a worker takes next (`choose_next`): the oldest prepared one that fits both budgets
and its host's free GPUs, with the line of jobs of several GPUs (`gangs.Line`)."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

from sqlalchemy.orm import Session

from app.jobs import gangs
from app.jobs import repository as repo
from app.jobs.budgets import budget_scopes, check_scope
from app.jobs.models import Job
from app.projects import service as projects
from app.settings import Settings

__all__ = ["choose_next"]


def choose_next(
    session: Session,
    settings: Settings,
    *,
    queue: str,
    host: str,
    besides_worker: str | None = None,
    ready_before: datetime | None = None,
    room: gangs.RoomOf | None = None,
    reserved_too: bool = False,
    skip: Collection[int] = (),
) -> Job | None:
    """The oldest job of `queue` prepared on `host` that fits both budgets and the host's free
    GPUs; the caller holds the leasing lock (`repo.lock_leasing`) and claims it.

    A project over its budget is decided once per call and its jobs are skipped in the query,
    so however many of its jobs wait, the next project's job behind them is chosen; every
    waiting job shows the reason. `besides_worker` (a worker choosing its next job while it
    runs one) does not count that worker's own GPU against the budgets; `ready_before` skips
    jobs whose preparation on `host` finished later; `reserved_too` (an idle worker) counts the
    jobs that busy workers have reserved as waiting in their place in line; `skip`: jobs not to
    take (reserved ones the caller may not take over).

    Jobs of several GPUs, the host's reservation for them and backfill: `gangs.Line`.
    """
    globally = check_scope(
        session, "global", None, budget_scopes(settings, None)[0][2], besides_worker
    )
    if globally is not None:
        repo.set_wait_reason(session, queue, globally)
        return None
    blocked: dict[int, str] = {}
    tried: set[int] = set(skip)
    chosen: Job | None = None
    line = gangs.Line(host, room, settings.gang_window)
    while chosen is None and not line.stopped:
        batch = [
            j
            for j in repo.leasable(
                session,
                queue,
                exclude_projects=list(blocked),
                host=host,
                ready_before=ready_before,
                reserved_too=reserved_too,
            )
            if j.id not in tried
        ]
        if not batch:
            break
        for position, job in enumerate(batch):
            tried.add(job.id)
            if job.project_id in blocked:
                continue
            reason = _over_budget(session, settings, job, besides_worker)
            if reason is not None:
                blocked[job.project_id] = reason
                continue
            if not line.admits(job):
                if line.stopped:
                    break
                continue
            chosen = job
            # A job of several GPUs close behind that fits the host now goes first: the
            # window of free GPUs it needs is rare, and one-GPU jobs would break it up.
            gang = line.gang_ahead(job, batch[position + 1 :])
            if gang is not None:
                if _over_budget(session, settings, gang, besides_worker) is None:
                    chosen = gang
                else:
                    line.reasons.pop(job.id, None)  # not passed after all
            break
    for project_id, reason in blocked.items():
        repo.set_wait_reason(session, queue, reason, project_id=project_id)
    repo.clear_wait_reasons(session, queue, keep_projects=list(blocked))
    for job_id, reason in line.reasons.items():
        repo.set_job_wait_reason(session, job_id, reason)
    return chosen


def _over_budget(
    session: Session, settings: Settings, job: Job, besides_worker: str | None
) -> str | None:
    """Why the job's project's budget holds it now, or None."""
    project = projects.find_project_by_id(session, job.project_id)
    assert project is not None
    label, project_id, budget = budget_scopes(settings, project)[0]
    return check_scope(session, label, project_id, budget, besides_worker, job.gpus)
