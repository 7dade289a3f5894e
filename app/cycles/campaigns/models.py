"""A campaign and its steps (ops DB). A step is one cycle started at the line's tip; its
confirmation, and the campaign's final measurement, are cycles too (`Cycle.role`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.db import OpsBase


class Campaign(OpsBase):
    """A research line: a branch that starts at the project's base and fast-forwards only to
    confirmed wins, its cycles, and at the end one pull request. `driver.advance` moves it."""

    __tablename__ = "campaign"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    # running -> finishing -> finished | stopped; failed from anywhere
    state: Mapped[str] = mapped_column(String(16), default="running", index=True)
    agent: Mapped[str | None] = mapped_column(String(16))
    experiment: Mapped[str | None] = mapped_column(String(64))
    max_cycles: Mapped[int] = mapped_column(Integer, default=10)
    parallel: Mapped[int] = mapped_column(Integer, default=1)
    stop_after_no_gain: Mapped[int | None] = mapped_column(Integer)
    max_hours: Mapped[float | None] = mapped_column(Float)
    line_branch: Mapped[str | None] = mapped_column(String(255))
    start_sha: Mapped[str | None] = mapped_column(String(64))
    tip_sha: Mapped[str | None] = mapped_column(String(64))
    # The round of steps now running: each started at the same tip.
    round: Mapped[int] = mapped_column(Integer, default=0)
    stop_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    end_reason: Mapped[str | None] = mapped_column(Text)
    final_cycle_id: Mapped[int | None] = mapped_column(Integer)
    cumulative: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    finding_ids: Mapped[list[str] | None] = mapped_column(JSON)
    pr_number: Mapped[int | None] = mapped_column(Integer)
    pr_url: Mapped[str | None] = mapped_column(String(1024))
    # The reviewer's decision on the line's pull request: approved | rejected.
    decision: Mapped[str | None] = mapped_column(String(16))
    decided_by: Mapped[str | None] = mapped_column(String(64))
    decision_note: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)
    created_by: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class CampaignStep(OpsBase):
    """One step: a cycle from the tip of round `round`, and what became of its candidate.
    `outcome` is None while it is judged or confirmed, `confirmed` once the keep rule would
    keep it (the round's best of those advances the line), then `kept` or `discarded`."""

    __tablename__ = "campaign_step"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    campaign_id: Mapped[int] = mapped_column(
        ForeignKey("campaign.id", ondelete="CASCADE"), index=True
    )
    cycle_id: Mapped[int] = mapped_column(ForeignKey("cycle.id", ondelete="CASCADE"), unique=True)
    round: Mapped[int] = mapped_column(Integer)
    tip_sha: Mapped[str] = mapped_column(String(64))
    confirmation_cycle_id: Mapped[int | None] = mapped_column(Integer, unique=True)
    outcome: Mapped[str | None] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(String(24))
    sentence: Mapped[str | None] = mapped_column(Text)
    ratio: Mapped[float | None] = mapped_column(Float)
    ci_low: Mapped[float | None] = mapped_column(Float)
    ci_high: Mapped[float | None] = mapped_column(Float)
    kept_sha: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
