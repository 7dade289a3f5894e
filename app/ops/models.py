"""Operational tables: they live in the ops DB only and hold no research knowledge."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text
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
    # Two separate limits (DESIGN.md, lesson 7): average use per day and peak concurrency.
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


class Job(OpsBase):
    """Work for one GPU, standalone or a cycle's. Its state lives here, not in the broker.

    A broker message only says "look at job N"; a worker re-reads this row and acts only if the
    job still needs it (DESIGN.md, "Recovery").
    """

    __tablename__ = "job"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cycle_id: Mapped[int | None] = mapped_column(Integer, index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    experiment: Mapped[str] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    queue: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    time_limit_s: Mapped[float] = mapped_column(Float, default=600.0)
    # The global order of the original requests: submission time, then id as tie-break.
    order_key: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    submitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    prepared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    leased_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_line_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    idle_gap_s: Mapped[float | None] = mapped_column(Float)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    worker: Mapped[str | None] = mapped_column(String(255))
    workdir: Mapped[str | None] = mapped_column(String(1024))
    venv_path: Mapped[str | None] = mapped_column(String(1024))
    result_path: Mapped[str | None] = mapped_column(String(1024))
    log_path: Mapped[str | None] = mapped_column(String(1024))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    wait_reason: Mapped[str | None] = mapped_column(String(255))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_by: Mapped[str | None] = mapped_column(String(64))


class Lease(OpsBase):
    """Who holds a job now. One per job at most; expires unless the worker keeps heartbeating."""

    __tablename__ = "lease"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), unique=True)
    worker: Mapped[str] = mapped_column(String(255))
    host: Mapped[str] = mapped_column(String(255))
    device: Mapped[str] = mapped_column(String(64))
    pid: Mapped[int | None] = mapped_column(Integer)
    pgid: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class Worker(OpsBase):
    """A GPU (or CPU) worker as it last reported itself."""

    __tablename__ = "worker"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    devices: Mapped[str] = mapped_column(String(64), default="")
    host: Mapped[str] = mapped_column(String(255))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    current_job_id: Mapped[int | None] = mapped_column(Integer)
    last_job_finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class QueueLock(OpsBase):
    """One row per lock name. Leasing updates it first, which serialises leasers on both back ends,
    so two workers can never both see room under a budget and both take a GPU."""

    __tablename__ = "queue_lock"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    counter: Mapped[int] = mapped_column(Integer, default=0)


class Cycle(OpsBase):
    """One research cycle, from trigger to a pull request awaiting review. `advance` moves it."""

    __tablename__ = "cycle"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(24), default="planned", index=True)
    agent: Mapped[str] = mapped_column(String(16), default="sweep")
    trigger: Mapped[str] = mapped_column(String(16), default="api")
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    experiment: Mapped[str | None] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    hypothesis: Mapped[str | None] = mapped_column(Text)
    changed_hypothesis: Mapped[str | None] = mapped_column(Text)
    proposal: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    repeat_of: Mapped[str | None] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(Integer)
    worktree: Mapped[str | None] = mapped_column(String(1024))
    branch: Mapped[str | None] = mapped_column(String(255))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    commit_sha: Mapped[str | None] = mapped_column(String(64))
    pr_number: Mapped[int | None] = mapped_column(Integer)
    pr_url: Mapped[str | None] = mapped_column(String(1024))
    verdict: Mapped[str | None] = mapped_column(String(24))
    headline: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    finding_ids: Mapped[list[str] | None] = mapped_column(JSON)
    gpu_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    agent_tokens: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CycleStep(OpsBase):
    """One attempt at one step of a cycle, with its times: the cycle's audit trail."""

    __tablename__ = "cycle_step"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cycle_id: Mapped[int] = mapped_column(ForeignKey("cycle.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(24))
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(16), default="started")
    detail: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
