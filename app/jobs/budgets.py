"""The two GPU budgets: peak (concurrent GPUs) and average (GPU-hours per day), per project and
globally. Checked when a job is leased or reserved, and by the planner and the schedules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from app.clock import utcnow
from app.jobs import repository as repo
from app.projects.models import Project
from app.settings import Settings


@dataclass
class Budget:
    gpu_hours_per_day: float | None
    concurrent_gpus: int | None


def budget_scopes(
    settings: Settings, project: Project | None
) -> list[tuple[str, int | None, Budget]]:
    scopes: list[tuple[str, int | None, Budget]] = []
    if project is not None:
        scopes.append(
            (
                f"project {project.name}",
                project.id,
                Budget(project.budget_gpu_hours_per_day, project.budget_concurrent_gpus),
            )
        )
    scopes.append(
        ("global", None, Budget(settings.budget_gpu_hours_per_day, settings.budget_concurrent_gpus))
    )
    return scopes


def check_scope(
    session: Session,
    label: str,
    project_id: int | None,
    budget: Budget,
    besides_worker: str | None = None,
    gpus: int = 1,
) -> str | None:
    """Why a job of `gpus` GPUs may not start in this scope now, or None."""
    if budget.concurrent_gpus is not None:
        active = repo.active_count(session, project_id, besides_worker)
        if active + gpus > budget.concurrent_gpus:
            needs = f"; this job needs {gpus}" if gpus > 1 else ""
            return f"peak budget: {label} uses {active}/{budget.concurrent_gpus} GPUs{needs}"
    if budget.gpu_hours_per_day is not None:
        day_ago = utcnow() - timedelta(days=1)
        used_h = repo.gpu_seconds_since(session, day_ago, project_id) / 3600
        if used_h >= budget.gpu_hours_per_day:
            return (
                f"average budget: {label} used {used_h:.2f}/{budget.gpu_hours_per_day:g} "
                "GPU-hours in the last 24 h"
            )
    return None


def blocked_by_budget(session: Session, settings: Settings, project: Project | None) -> str | None:
    """Why a job of `project` may not take a GPU now, or None. Peak (concurrent GPUs) and
    average (GPU-hours per day) are two limits, checked separately, per project and globally."""
    for label, project_id, budget in budget_scopes(settings, project):
        reason = check_scope(session, label, project_id, budget)
        if reason is not None:
            return reason
    return None
