"""Project schedules: `every 2h` (also m, d) or a five-field cron expression, checked by beat."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from celery.schedules import crontab

from app.errors import InvalidInput

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
        return crontab(*fields)
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
    # crontab: due when its next firing time after the last run has passed.
    remaining = rule.remaining_estimate(last_run)
    return bool(last_run + remaining <= now)
