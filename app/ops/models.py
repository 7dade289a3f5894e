"""Operational tables: they live in the ops DB only and hold no research knowledge."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import JSON, DateTime, Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.db import naming_metadata


def utcnow() -> datetime:
    return datetime.now(UTC)


class OpsBase(DeclarativeBase):
    metadata = naming_metadata()


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


class ApiToken(OpsBase):
    """A bearer token: only its sha256 is stored; the token itself is shown once at creation."""

    __tablename__ = "api_token"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[str]] = mapped_column(JSON)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
