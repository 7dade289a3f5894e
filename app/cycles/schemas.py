"""Shapes of the cycles' REST input and output."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.clock import UtcDatetime

Scalar = int | float | str | bool


class CycleCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str
    agent: str | None = Field(default=None, description="sweep (default) or command")
    experiment: str | None = None
    parameters: dict[str, Scalar] | None = None
    changed_hypothesis: str | None = Field(
        default=None, max_length=4000, description="What changed since the recorded verdict"
    )


class StepOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    attempt: int
    status: str
    detail: str | None
    started_at: UtcDatetime
    finished_at: UtcDatetime | None


class CycleOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    project_id: int
    state: str
    agent: str
    experiment: str | None
    parameters: dict[str, Any] | None
    hypothesis: str | None
    changed_hypothesis: str | None
    fingerprint: str | None
    repeat_of: str | None
    job_id: int | None = None  # not a cycle column: its job is found by Job.cycle_id
    branch: str | None
    commit_sha: str | None
    pr_number: int | None
    pr_url: str | None
    verdict: str | None
    headline: dict[str, Any] | None
    finding_ids: list[str] | None
    gpu_seconds: float
    agent_tokens: int | None
    agent_exchange: list[dict[str, Any]] | None = None
    error: str | None
    created_at: UtcDatetime
    updated_at: UtcDatetime
    steps: list[StepOut] = Field(default_factory=list)


class ReviewDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    note: str = Field(default="", max_length=10_000)
    merge: bool = Field(default=False, description="On approve: merge the PR (re-validated)")


class AutopilotSet(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool
    schedule: str | None = Field(
        default=None, max_length=64, description="'every 2h' or a cron expression"
    )


class AutopilotOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    autopilot_enabled: bool
    schedule: str | None
    last_scheduled_at: UtcDatetime | None
