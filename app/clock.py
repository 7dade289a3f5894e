"""The service's one clock: timezone-aware UTC, and a reader for naive values SQLite returns."""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    """A stored time as aware UTC: SQLite hands back naive datetimes for aware columns."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)
