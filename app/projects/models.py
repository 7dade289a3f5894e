"""Projects and API tokens (ops DB)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.db import OpsBase


class Project(OpsBase):
    """A research repository the autopilot runs cycles on."""

    __tablename__ = "project"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    repo_url: Mapped[str] = mapped_column(String(1024))
    default_branch: Mapped[str] = mapped_column(String(255), default="main")
    forge: Mapped[str] = mapped_column(String(16), default="local")
    gpu_kind: Mapped[str] = mapped_column(String(32), default="cpu")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Two separate limits (docs/design.md, "Separate budgets for average and peak"): average use
    # per day and peak concurrency.
    budget_gpu_hours_per_day: Mapped[float | None] = mapped_column(Float)
    budget_concurrent_gpus: Mapped[int | None] = mapped_column(Integer)
    # The autopilot schedule: `every 2h` or a cron expression; beat starts cycles when due.
    schedule: Mapped[str | None] = mapped_column(String(64))
    autopilot_enabled: Mapped[bool] = mapped_column(Boolean, default=False)
    last_scheduled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class ApiToken(OpsBase):
    """A bearer token: only its sha256 is stored; the token itself is shown once at creation."""

    __tablename__ = "api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class SigninSession(OpsBase):
    """A dashboard sign-in, server-side: the cookie names it (by the sha256 of its id), and
    logout or the token's revocation ends it, whatever becomes of the cookie."""

    __tablename__ = "signin_session"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the cookie's id
    token_id: Mapped[int] = mapped_column(
        Integer, ForeignKey("api_token.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
