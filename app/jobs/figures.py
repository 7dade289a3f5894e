"""The queue's figures: depth, age, idle gap and duty cycle per queue, GPU use, counts by state,
durations and lease expiries. What the dashboard, `/metrics` and `autopilot status` read."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.jobs import repository as repo
from app.jobs.lifecycle import ACTIVE, WAITING
from app.jobs.models import Job
from app.settings import Settings


def queues(session: Session, settings: Settings) -> list[dict[str, Any]]:
    """Jobs per state and the oldest waiting job (queued or reserved: neither has started)
    per queue, plus the recent idle gap and duty cycle."""
    summary = {f"gpu.{k}": _queue_entry(f"gpu.{k}") for k in settings.gpu_kinds}
    for queue, state, count, oldest in repo.queue_summary(session):
        entry = summary.setdefault(queue, _queue_entry(queue))
        entry[state] = count
        if state in WAITING:
            first, at = entry["oldest_queued_at"], aware(oldest)
            entry["oldest_queued_at"] = at if first is None or (at and at < first) else first
    since = utcnow() - timedelta(hours=1)
    for queue, entry in summary.items():
        jobs = repo.recent_finished(session, queue, since)
        gaps = sorted(j.idle_gap_s for j in jobs if j.idle_gap_s is not None)
        entry["idle_gap_median_s"] = gaps[len(gaps) // 2] if gaps else None
        entry["duty_cycle"] = duty_cycle(jobs)
    return list(summary.values())


def _queue_entry(queue: str) -> dict[str, Any]:
    return {
        "queue": queue,
        **{str(state): 0 for state in (*WAITING, *ACTIVE)},
        "oldest_queued_at": None,
    }


def duty_cycle(jobs: Sequence[Job]) -> float | None:
    """Busy time over wall time across back-to-back jobs (first line to finish, per worker)."""
    spans = sorted(
        (aware(j.first_line_at), aware(j.finished_at))
        for j in jobs
        if j.first_line_at is not None and j.finished_at is not None and j.idle_gap_s is not None
    )
    if len(spans) < 2:
        return None
    busy = sum((end - start).total_seconds() for start, end in spans if start and end)
    gaps = sum(j.idle_gap_s or 0.0 for j in jobs if j.idle_gap_s is not None)
    total = busy + gaps
    return busy / total if total > 0 else None


def counts_by_queue_and_state(session: Session) -> dict[str, dict[str, int]]:
    return repo.counts_by_queue_and_state(session)


def duration_histogram(
    session: Session, bounds: Sequence[float]
) -> list[tuple[str, int, float, list[int]]]:
    """GPU seconds of finished jobs per queue: (queue, count, sum, cumulative bucket counts)."""
    return repo.duration_histogram(session, bounds)


def lease_expiries(session: Session) -> dict[str, int]:
    """Leases that lapsed, per queue (derived from attempts; see the repository)."""
    return repo.lease_expiries(session)


def gpu_use(session: Session, project_id: int | None, since: datetime) -> tuple[float, int]:
    """(GPU-hours used since `since`, GPUs in use now) of one project, or of all with None."""
    return (
        repo.gpu_seconds_since(session, since, project_id) / 3600,
        repo.active_count(session, project_id),
    )


# -- what moves: the dashboard's live pages compare these ---------------------------------


def change_marks(session: Session) -> tuple[object, ...]:
    """What moves when any job is added or moves on (the dashboard's live pages compare it)."""
    return repo.change_marks(session)


def holder_marks(session: Session) -> list[tuple[object, ...]]:
    """What moves when a job is leased or released, or a worker takes another job."""
    return repo.holder_marks(session)
