"""Each GPU host's preparation of the jobs of its kind (docs/design.md, "Hosts and
boundaries"): a host claims a job, prepares its clean export and venv, and records it ready
(then a worker of that host may lease it) or failed (then other hosts still may; the job fails
once every host seen lately has failed it)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.lifecycle import PREPARATION, WAITING, JobState
from app.jobs.models import Job, JobPreparation
from app.settings import Settings


def needs_preparation(session: Session, queue: str, host: str, limit: int) -> Sequence[int]:
    """Waiting jobs of `queue` (reserved ones too) this host has not prepared or tried yet,
    oldest first."""
    return repo.unprepared_on(session, queue, host, limit)


def ready_on(session: Session, queue: str, host: str) -> int:
    """How many queued jobs of `queue` wait prepared on this host."""
    return repo.ready_count_on(session, queue, host)


def claim_preparation(
    session: Session,
    job_id: int,
    host: str,
    *,
    stale_after_s: float = 3600.0,
    preparer_gone: bool = False,
) -> Job | None:
    """Start this host's preparation of the job; the job, or None when it needs none here
    (ended, cancelled, prepared or being prepared on this host). A preparation left unfinished
    is taken over when the caller knows its preparer is gone (`preparer_gone`: it holds the
    host's lock for the job, which a live preparer would hold), or after `stale_after_s`."""
    job = repo.get(session, job_id)
    if job is None or job.state not in WAITING or job.cancel_requested_at is not None:
        return None
    now = utcnow()
    row = repo.preparation(session, job_id, host)
    if row is not None:
        started = aware(row.started_at) or now
        stale = preparer_gone or (now - started).total_seconds() >= stale_after_s
        if row.state != "preparing" or not stale:
            return None
        row.started_at, row.error = now, None
        session.flush()
        return job
    try:
        with session.begin_nested():
            repo.add(
                session, JobPreparation(job_id=job_id, host=host, state="preparing", started_at=now)
            )
    except IntegrityError:  # another worker of this host claimed it first
        return None
    return job


def preparation_ready(
    session: Session,
    job_id: int,
    host: str,
    *,
    workdir: str,
    venv_path: str,
    environment: dict[str, Any] | None = None,
) -> bool:
    """Record this host's finished preparation, with the environment record of its venv (the
    job takes it when this host leases it); True when the job still waits to be leased."""
    row = repo.preparation(session, job_id, host)
    if row is None:
        row = JobPreparation(job_id=job_id, host=host, state="preparing")
        repo.add(session, row)
    PREPARATION.move(
        row,
        "ready",
        workdir=workdir,
        venv_path=venv_path,
        environment=environment,
        error=None,
        finished_at=utcnow(),
    )
    job = repo.get(session, job_id)
    if job is None or job.state not in WAITING:
        session.flush()
        return False
    if job.prepared_at is None:
        job.prepared_at = row.finished_at
    session.flush()
    return True


def record_venv_progress(
    session: Session, job_id: int, host: str, progress: dict[str, Any]
) -> None:
    """This host's venv build progress for the job (`{"state": "building", "packages": 37,
    "elapsed_s": 12.0, ...}`), shown on the queue page while the job waits for it."""
    row = repo.preparation(session, job_id, host)
    if row is not None and row.state == "preparing":
        row.environment = progress
        session.flush()


def building_venvs(session: Session, job_ids: Sequence[int]) -> dict[int, str]:
    """Per job, a line on its venv build in progress on some host ("building venv: 37
    packages, 12 s"); jobs with none are left out."""
    lines: dict[int, str] = {}
    for row in repo.preparations_in_progress(session, job_ids):
        env = row.environment or {}
        if env.get("state") == "building":
            lines[row.job_id] = venv_progress_line(env)
    return lines


def venv_progress_line(progress: dict[str, Any]) -> str:
    """One venv build's progress as the job's log and the queue page show it."""
    verb = "built" if progress.get("state") == "built" else "building"
    packages, elapsed = progress.get("packages", 0), float(progress.get("elapsed_s", 0.0))
    return f"{verb} venv: {packages} packages, {elapsed:.0f} s"


def preparation_failed(
    session: Session, settings: Settings, job_id: int, host: str, error: str
) -> bool:
    """Record this host's failed preparation. The job stays available to other hosts of its
    kind; it fails only once every host seen lately has failed it. True when it failed now."""
    row = repo.preparation(session, job_id, host)
    if row is None:
        row = JobPreparation(job_id=job_id, host=host, state="preparing")
        repo.add(session, row)
    PREPARATION.move(row, "failed", error=error[:4000], finished_at=utcnow())
    session.flush()
    job = repo.get(session, job_id)
    if job is None or job.state != JobState.QUEUED:
        return False
    kind = job.queue.removeprefix("gpu.")
    since = utcnow() - timedelta(seconds=max(60.0, 3 * settings.heartbeat_interval_s))
    hosts = repo.hosts_seen_since(session, kind, since) | {host}
    failed = {p.host for p in repo.preparations(session, job_id) if p.state == "failed"}
    if not hosts <= failed:
        return False
    jobs.fail_unstarted(session, job_id, f"preparation failed on {host}: {error}")
    return True


def preparation_on(session: Session, job_id: int, host: str) -> JobPreparation | None:
    return repo.preparation(session, job_id, host)
