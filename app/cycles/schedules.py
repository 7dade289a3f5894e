"""The autopilot: a project's schedule (`every 2h`, also m and d, or a five-field cron
expression), switched on and off, and beat's tick that starts the cycles that are due and
resumes those deferred for budget once it allows."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime, timedelta

from celery.schedules import crontab
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.cycles import repository, service
from app.cycles.exceptions import TooManyCycles
from app.errors import InvalidInput
from app.jobs import budgets
from app.projects import service as projects
from app.projects.models import Project
from app.settings import Settings

log = logging.getLogger(__name__)

_EVERY = re.compile(r"^every\s+(\d+)\s*([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def parse(expression: str) -> timedelta | crontab:
    text = expression.strip().lower()
    every = _EVERY.fullmatch(text)
    if every:
        amount = int(every.group(1))
        if amount <= 0:
            raise InvalidInput(f"schedule {expression!r}: the interval must be positive")
        return timedelta(**{_UNITS[every.group(2)]: amount})
    fields = text.split()
    if len(fields) != 5:
        raise InvalidInput(
            f"schedule {expression!r} is neither 'every N[m|h|d]' (e.g. 'every 2h') nor a "
            "five-field cron expression (e.g. '0 */2 * * *')"
        )
    try:
        # Cron's order; Celery's crontab takes day_of_week third when given by position.
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        return crontab(
            minute=minute,
            hour=hour,
            day_of_month=day_of_month,
            month_of_year=month_of_year,
            day_of_week=day_of_week,
        )
    except (ValueError, TypeError) as exc:
        raise InvalidInput(f"schedule {expression!r}: {exc}") from None


def is_due(expression: str, last_run: datetime | None, now: datetime | None = None) -> bool:
    """Whether a cycle should start now, given when the schedule last started one."""
    now = now or datetime.now(UTC)
    if last_run is None:
        return True
    if last_run.tzinfo is None:
        last_run = last_run.replace(tzinfo=UTC)
    rule = parse(expression)
    if isinstance(rule, timedelta):
        return now - last_run >= rule
    # crontab: due when its next firing time after the last run has passed. (Celery's
    # `remaining_estimate` counts from the wall clock, not from `now`: it made an hourly cron
    # fire at the half hour and a daily one about every 12 hours.)
    return next_fire(rule, last_run) <= now


def next_fire(rule: crontab, after: datetime) -> datetime:
    """The first minute strictly after `after` (UTC) that `rule` matches. As in Celery, a rule
    that restricts both the day of the month and the day of the week needs both to match."""
    t = (after.astimezone(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    hours, minutes = sorted(rule.hour), sorted(rule.minute)
    for _ in range(366 * 29):  # a rule such as Feb 29 on a Monday matches within 28 years
        if (
            t.month in rule.month_of_year
            and t.day in rule.day_of_month
            and t.isoweekday() % 7 in rule.day_of_week  # cron: 0 is Sunday
        ):
            for hour in hours:
                if hour < t.hour:
                    continue
                for minute in minutes:
                    if hour == t.hour and minute < t.minute:
                        continue
                    return t.replace(hour=hour, minute=minute)
        t = (t + timedelta(days=1)).replace(hour=0, minute=0)
    raise InvalidInput("this cron schedule never fires")


def set_autopilot(session: Session, name: str, enabled: bool, schedule: str | None) -> Project:
    """Start or stop a project's schedule; starting needs a schedule (given or stored)."""
    project = projects.get_project(session, name)
    if schedule is not None:
        rule = parse(schedule)
        if not isinstance(rule, timedelta):
            next_fire(rule, utcnow())  # InvalidInput for a rule that never fires
        project.schedule = schedule
    if enabled and not project.schedule:
        raise InvalidInput("schedule: give one to start the autopilot, e.g. 'every 2h'")
    project.autopilot_enabled = enabled
    session.flush()
    return project


def schedule_tick(session: Session, settings: Settings) -> list[int]:
    """Beat's tick: start the cycles that are due, and resume deferred ones whose budget
    allows again. Returns the cycles to ring (after the caller commits)."""
    now = utcnow()
    ring: list[int] = []
    for project in projects.on_autopilot(session):
        try:
            due = bool(project.schedule) and is_due(
                str(project.schedule), project.last_scheduled_at, now
            )
        except InvalidInput as exc:  # one project's bad rule stops no other project's
            log.warning("schedule of %s skipped: %s", project.name, exc.detail)
            continue
        if not due:
            continue
        project.last_scheduled_at = now
        try:
            with session.begin_nested():
                cycle, _ = service.create(
                    session,
                    service.Trigger(project=project.name, trigger="schedule"),
                    max_live=settings.max_live_cycles_per_project,
                )
        except TooManyCycles:
            log.warning("schedule of %s skipped: too many unfinished cycles", project.name)
            continue
        ring.append(cycle.id)
    for cycle in repository.deferred(session):
        owner = projects.find_project_by_id(session, cycle.project_id)
        if owner is not None and budgets.blocked_by_budget(session, settings, owner) is None:
            repository.set_state(session, cycle, "planned")
            ring.append(cycle.id)
    session.flush()
    return ring


def resume_deferred(session: Session, settings: Settings, project_id: int, limit: int) -> list[int]:
    """Return up to `limit` of the project's oldest `deferred_budget` cycles to `planned`
    when its budgets allow a job now; the caller rings them after commit."""
    owner = projects.find_project_by_id(session, project_id)
    if owner is None or budgets.blocked_by_budget(session, settings, owner) is not None:
        return []
    waiting = repository.oldest_deferred_locked(session, project_id, limit)
    for cycle in waiting:
        repository.set_state(session, cycle, "planned")
    session.flush()
    return [c.id for c in waiting]
