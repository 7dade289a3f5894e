"""Research memory tables, in the memory DB only; evidence refers to ops by plain values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import DateTime, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.db import naming_metadata


def utcnow() -> datetime:
    return datetime.now(UTC)


class MemoryBase(DeclarativeBase):
    metadata = naming_metadata()


class Finding(MemoryBase):
    """A lesson, verdict, bound or policy, with its status. (First shape; issue 5 extends it.)"""

    __tablename__ = "finding"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: uuid.uuid4().hex)
    project: Mapped[str | None] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    statement: Mapped[str] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="proposed", index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
