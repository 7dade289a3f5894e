"""Shapes of the GPU queue's REST input and output."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from app.clock import UtcDatetime

Scalar = int | float | str | bool


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str = Field(description="A registered project's name")
    experiment: str = Field(description="An experiment the project declares in autopilot.toml")
    parameters: dict[str, Scalar] = Field(default_factory=dict)
    queue: str | None = Field(default=None, description="gpu.<kind>; default: the project's kind")


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    cycle_id: int | None
    project_id: int
    experiment: str
    parameters: dict[str, Any]
    queue: str
    state: str
    attempts: int
    submitted_at: UtcDatetime
    prepared_at: UtcDatetime | None
    started_at: UtcDatetime | None
    finished_at: UtcDatetime | None
    gpu_seconds: float
    idle_gap_s: float | None
    worker: str | None
    error: str | None
    wait_reason: str | None
    cancelled_by: str | None
    cancel_requested_at: UtcDatetime | None
    # The code it runs, as a commit GPU hosts fetch: from where, which branch, which commits.
    repo: str | None = None
    ref: str | None = None
    head_sha: str | None = None
    base_sha: str | None = None
    result: dict[str, Any] | None = None
    environment: dict[str, Any] | None = Field(
        default=None,
        description="Where it ran: its venv's key, installer (uv or pip) and lock (`uv pip "
        "freeze` of the venv's own packages), as the host that ran it prepared it",
    )
    project: str | None = Field(default=None, description="The project's name (in lists)")


class JobLogStored(BaseModel):
    """The control host's copy of a job's whole log, as a GPU host uploaded it."""

    job_id: int
    bytes: int = Field(description="The stored log's size in bytes")


class WorkerOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    name: str
    kind: str
    devices: str
    host: str
    last_seen: UtcDatetime
    current_job_id: int | None


class QueueOut(BaseModel):
    queue: str
    queued: int
    reserved: int  # waiting too, to run next on a busy worker's GPU
    leased: int
    running: int
    oldest_queued_at: UtcDatetime | None
    idle_gap_median_s: float | None
    duty_cycle: float | None
