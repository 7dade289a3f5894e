"""The service's one clock: timezone-aware UTC, a reader for naive values SQLite returns, and
the one way an age is written for people (`42 s` on the dashboard, `42s` in `autopilot status`).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator

AgeStyle = Literal["spaced", "compact"]

# Per style: what an unknown age reads as, then (below this many seconds, divide by, format,
# unit) in order; the last row takes every larger age.
_AGE_STYLES: dict[AgeStyle, tuple[str, tuple[tuple[float, float, str, str], ...]]] = {
    # the dashboard: `42 s`, `5 min`, `3 h`, `2 d`
    "spaced": (
        "–",
        (
            (90, 1, ".0f", " s"),
            (90 * 60, 60, ".0f", " min"),
            (36 * 3600, 3600, ".0f", " h"),
            (math.inf, 86400, ".0f", " d"),
        ),
    ),
    # the terminal's narrow columns: `42s`, `5m`, `2.5h`
    "compact": (
        "-",
        (
            (120, 1, ".0f", "s"),
            (7200, 60, ".0f", "m"),
            (math.inf, 3600, ".1f", "h"),
        ),
    ),
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    """A stored time as aware UTC: SQLite hands back naive datetimes for aware columns."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


#: A time in an API answer: aware UTC whatever the store handed back (SQLite's are naive), so
#: it serialises as an RFC 3339 date-time, offset included, as the schema promises.
UtcDatetime = Annotated[datetime, AfterValidator(_utc)]


def age_text(seconds: float | None, style: AgeStyle = "spaced") -> str:
    """An age in seconds, short, in one of the two styles people read it in."""
    unknown, steps = _AGE_STYLES[style]
    if seconds is None:
        return unknown
    _, unit_s, number, unit = next((step for step in steps if seconds < step[0]), steps[-1])
    return f"{seconds / unit_s:{number}}{unit}"


def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago `value` was, in the dashboard's style (`42 s`, `5 min`, `3 h`, `2 d`)."""
    moment = aware(value)
    if moment is None:
        return age_text(None)
    return age_text(max(0.0, ((now or utcnow()) - moment).total_seconds()))
