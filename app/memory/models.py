"""Research memory tables, in the memory DB only; evidence refers to ops by plain values.

The full-text index (SQLite FTS5 table `finding_fts` and its shadow tables, PostgreSQL's
trigram index) is created by the migration and kept out of this metadata: `include_object`
tells Alembic's compare to leave it alone.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.clock import utcnow
from app.db import naming_metadata

KINDS = ("lesson", "verdict", "bound", "policy")
STATUSES = ("proposed", "validated", "refuted", "superseded")
SOURCE_STATUSES = ("verified", "unverified")
PUBLICATION_STATUSES = ("verified", "unverified", "not_applicable")

# Created by migrations/memory/versions/20261202_memory_findings.py, never by the metadata.
SEARCH_TABLE = "finding_fts"
TRIGRAM_INDEX = "ix_finding_statement_trgm"


def is_search_index(name: str | None) -> bool:
    """The FTS5 table, its shadow tables (`finding_fts_data`, ...) and the trigram index."""
    if name is None:
        return False
    return name in (SEARCH_TABLE, TRIGRAM_INDEX) or name.startswith(SEARCH_TABLE + "_")


def include_object(_obj: Any, name: str | None, _type: str, reflected: bool, _other: Any) -> bool:
    """Alembic `include_object` hook: compare everything but the search index."""
    return not (reflected and is_search_index(name))


class MemoryBase(DeclarativeBase):
    metadata = naming_metadata()


class Finding(MemoryBase):
    """A lesson, verdict, bound or policy, with its status, provenance and evidence."""

    __tablename__ = "finding"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=lambda: uuid.uuid4().hex)
    project: Mapped[str | None] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(16), index=True)
    # Kept byte-exact: never normalised, trimmed or filled in (docs/design.md, "Unverified stays
    # unverified").
    statement: Mapped[str] = mapped_column(Text)
    language: Mapped[str] = mapped_column(String(16), default="und")
    # sha256 of the normalised (project, kind, statement): what makes imports idempotent.
    content_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hypothesis: Mapped[str | None] = mapped_column(Text)
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    device_kind: Mapped[str | None] = mapped_column(String(64), index=True)
    scope: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="proposed", index=True)
    source: Mapped[str | None] = mapped_column(Text)
    source_status: Mapped[str] = mapped_column(String(16), default="unverified")
    publication_status: Mapped[str] = mapped_column(String(16), default="unverified")
    truncated: Mapped[bool] = mapped_column(Boolean, default=False)
    group_name: Mapped[str | None] = mapped_column(String(64))
    tags: Mapped[list[str]] = mapped_column(JSON, default=list)
    # Evidence as plain values: the ops DB is never referenced by key (docs/design.md, "Two
    # stores, kept apart").
    cycle_id: Mapped[str | None] = mapped_column(String(64))
    commit_sha: Mapped[str | None] = mapped_column(String(64))
    pr_url: Mapped[str | None] = mapped_column(String(1024))
    result_path: Mapped[str | None] = mapped_column(String(1024))
    validated_by: Mapped[str | None] = mapped_column(String(64))
    validated_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    supersedes: Mapped[str | None] = mapped_column(
        String(32), ForeignKey("finding.id", ondelete="RESTRICT"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class FindingEvent(MemoryBase):
    """One status change of a finding (creation included): the audit trail."""

    __tablename__ = "finding_event"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    finding_id: Mapped[str] = mapped_column(
        String(32), ForeignKey("finding.id", ondelete="CASCADE"), index=True
    )
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
