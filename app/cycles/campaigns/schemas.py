"""A campaign's request and its JSON (`GET /api/v1/campaigns/{id}`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CampaignState = Literal["running", "finishing", "finished", "stopped", "failed"]


class CampaignCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(min_length=1, max_length=64)
    agent: str | None = Field(None, description="the agent of each step (default: the config's)")
    experiment: str | None = Field(
        None,
        max_length=64,
        description="the experiment the final measurement runs (default: the first kept step's)",
    )
    max_cycles: int = Field(10, ge=1, le=1000, description="steps at most")
    parallel: int = Field(1, ge=1, le=64, description="steps at once from the same tip")
    stop_after_no_gain: int | None = Field(
        None, ge=1, le=1000, description="end after this many steps in a row are not kept"
    )
    max_hours: float | None = Field(None, gt=0, le=720, description="start no round after this")


class CampaignReview(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    note: str = Field("", max_length=10_000, description="required to reject: why")


class StepOut(BaseModel):
    cycle_id: int
    round: int
    state: str | None = None  # the step's cycle's
    hypothesis: str | None = None
    tip_sha: str
    confirmation_cycle_id: int | None = None
    outcome: str | None = None  # kept | discarded (confirmed: waiting for its round)
    reason: str | None = None
    sentence: str | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    kept_sha: str | None = None


class CampaignOut(BaseModel):
    id: int
    project: str
    state: CampaignState
    agent: str | None
    experiment: str | None
    max_cycles: int
    parallel: int
    stop_after_no_gain: int | None
    max_hours: float | None
    line_branch: str | None
    start_sha: str | None
    tip_sha: str | None
    round: int
    stop_requested: bool
    end_reason: str | None
    steps: list[StepOut]
    kept: int
    final_cycle_id: int | None
    cumulative: dict[str, Any] | None
    pr_number: int | None
    pr_url: str | None
    finding_ids: list[str] | None
    decision: str | None
    decided_by: str | None
    decision_note: str | None
    error: str | None
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
