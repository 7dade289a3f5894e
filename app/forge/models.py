"""Forge tables in the ops DB: the local forge's pull requests and their comments."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.db import OpsBase

# At most one open PR per head branch: the database enforces what open_pull_request promises.
_OPEN = text("state = 'open'")


class PullRequestRecord(OpsBase):
    """A pull request on the local forge (GitHub keeps its own)."""

    __tablename__ = "pull_request"
    __table_args__ = (
        UniqueConstraint("project", "number", name="uq_pull_request_project_number"),
        Index(
            "uq_pull_request_open_head",
            "project",
            "head",
            unique=True,
            sqlite_where=_OPEN,
            postgresql_where=_OPEN,
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project: Mapped[str] = mapped_column(String(64), index=True)
    number: Mapped[int] = mapped_column(Integer)
    head: Mapped[str] = mapped_column(String(255))
    base: Mapped[str] = mapped_column(String(255))
    title: Mapped[str] = mapped_column(String(512))
    body: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(16), default="open")
    head_sha: Mapped[str | None] = mapped_column(String(64))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    merge_sha: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class PullRequestComment(OpsBase):
    __tablename__ = "pull_request_comment"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    pull_request_id: Mapped[int] = mapped_column(
        ForeignKey("pull_request.id", ondelete="CASCADE"), index=True
    )
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class WebhookDelivery(OpsBase):
    """A GitHub webhook delivery acted on (`X-GitHub-Delivery`): one seen again is answered
    without acting twice. Kept a while, then pruned (GitHub redelivers only recent ones)."""

    __tablename__ = "webhook_delivery"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    delivery_id: Mapped[str] = mapped_column(String(64), unique=True)
    event: Mapped[str] = mapped_column(String(64))
    received_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
