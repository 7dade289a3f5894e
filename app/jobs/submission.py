"""A standalone job's submission, from the API or the CLI: the one place in app.jobs that owns
its transactions. It reads the project's config from the forge's base branch (git) before any
transaction opens, records the job in a short one, and rings the prepare doorbell only once
that has committed: a rolled-back submit rings nothing, and no transaction waits on git."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app import broker
from app.db import Stores
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git.work import GitWork
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.schemas import JobOut
from app.projects import service as projects
from app.projects.models import Project
from app.settings import Settings


class DoorbellNotSent(Exception):
    """The job is stored, but its prepare doorbell was not sent; the reaper rings it later."""

    def __init__(self, job: JobOut, cause: Exception) -> None:
        super().__init__(f"job {job.id} is stored but its doorbell was not sent ({cause!r})")
        self.job = job
        self.cause = cause


def submit_and_ring(
    stores: Stores,
    settings: Settings,
    project: str,
    experiment: str,
    parameters: dict[str, Any],
    *,
    queue: str | None = None,
) -> JobOut:
    """Submit a standalone job of `project` in a transaction of its own and, once that has
    committed, ring the prepare doorbell."""
    with stores.ops_session() as session:
        ref = ProjectRef.of(_with_room(session, settings, project))
    forge = forge_service.forge_for(settings, stores)
    base, config = forge_service.config_at_base(GitWork(settings), forge, ref)
    # a standalone job runs the tip of the base branch, as the forge holds it now
    source = jobs.JobSource(forge.fetch_url(ref), ref.default_branch, base, base)
    with stores.ops_session() as session:
        row = _with_room(session, settings, project)  # again: others may have submitted since
        job = jobs.submit(
            session, settings, row, config, experiment, parameters, queue=queue, source=source
        )
        out = JobOut.model_validate(job)
    try:
        broker.ring_gpu(settings, out.queue)
    except Exception as exc:
        raise DoorbellNotSent(out, exc) from exc
    return out


def _with_room(session: Session, settings: Settings, project: str) -> Project:
    """The named project, when it has room for one more standalone job; TooManyJobs if not."""
    row = projects.get_project(session, project)
    live = repo.unfinished_standalone(session, row.id)
    if live >= settings.max_live_cycles_per_project:
        raise jobs.TooManyJobs(
            f"project {project!r} has {live} unfinished jobs submitted on their own (limit "
            f"{settings.max_live_cycles_per_project}, AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT, "
            "the same cap as its cycles); retry when some have finished"
        )
    return row
