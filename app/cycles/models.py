"""Cycles and their step audit trail (ops DB)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.db import OpsBase


class Cycle(OpsBase):
    """One research cycle, from trigger to a pull request awaiting review. `advance` moves it.

    Its job is the one whose `Job.cycle_id` names it (`app.jobs.service.for_cycle`)."""

    __tablename__ = "cycle"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    state: Mapped[str] = mapped_column(String(24), default="planned", index=True)
    agent: Mapped[str] = mapped_column(String(16), default="sweep")
    trigger: Mapped[str] = mapped_column(String(16), default="api")
    # sha256 of (token name, Idempotency-Key), and of the request it was first used with.
    idempotency_key: Mapped[str | None] = mapped_column(String(128), unique=True)
    idempotency_request: Mapped[str | None] = mapped_column(String(64))
    experiment: Mapped[str | None] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    hypothesis: Mapped[str | None] = mapped_column(Text)
    changed_hypothesis: Mapped[str | None] = mapped_column(Text)
    proposal: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    repeat_of: Mapped[str | None] = mapped_column(String(32))
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
    # The LLM agent's exchange: [{attempt, request, reply, usage, error}], for the reviewer.
    agent_exchange: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    # A campaign's cycle (docs/design.md, "Research lines"): its role there (a `step` an agent
    # proposes at the line's tip, the `confirmation` of one, or the campaign's `final`
    # measurement of its tip against its start) and, for the last two, the commit it runs.
    campaign_id: Mapped[int | None] = mapped_column(Integer, index=True)
    role: Mapped[str | None] = mapped_column(String(16))
    candidate_sha: Mapped[str | None] = mapped_column(String(64))
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
