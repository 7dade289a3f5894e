"""The GPU queue's tables: jobs, leases, workers and the leasing lock (ops DB)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from app.clock import utcnow
from app.db import OpsBase


class Job(OpsBase):
    """Work for one GPU, standalone or a cycle's. Its state lives here, not in the broker.

    A broker message only says "look at job N"; a worker re-reads this row and acts only if the
    job still needs it (docs/design.md, "Recovery: the ops DB is the truth"). Its states and the
    moves between them are app/jobs/lifecycle.py's.
    """

    __tablename__ = "job"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cycle_id: Mapped[int | None] = mapped_column(Integer, index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("project.id", ondelete="CASCADE"))
    experiment: Mapped[str] = mapped_column(String(64))
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    queue: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16), default="queued", index=True)  # JobState
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    time_limit_s: Mapped[float] = mapped_column(Float, default=600.0)
    # GPUs it runs on, all on one host, leased at once (app/jobs/gangs.py): its lease is the
    # leader's, the others' are `GangSeat`s.
    gpus: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
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
    # The code, as a commit GPU hosts fetch (docs/design.md, "Hosts and boundaries"): the URL
    # they fetch from (the forge), the branch that holds it, and the commits compared.
    repo: Mapped[str | None] = mapped_column(String(1024))
    ref: Mapped[str | None] = mapped_column(String(255))
    base_sha: Mapped[str | None] = mapped_column(String(64))
    head_sha: Mapped[str | None] = mapped_column(String(64))
    # Where it ran: the leasing host's clean export and venv (copied from its preparation).
    workdir: Mapped[str | None] = mapped_column(String(1024))
    venv_path: Mapped[str | None] = mapped_column(String(1024))
    # Its environment record: the venv's key, installer and lock (`Venv.environment`).
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    result_path: Mapped[str | None] = mapped_column(String(1024))
    log_path: Mapped[str | None] = mapped_column(String(1024))
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    wait_reason: Mapped[str | None] = mapped_column(String(255))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancelled_by: Mapped[str | None] = mapped_column(String(64))
    # The last lines of the job's log, kept by its worker while it runs (the whole log is
    # uploaded to the control host when it ends).
    log_tail: Mapped[str | None] = mapped_column(Text)
    # When the whole log's upload was recorded (its job had ended): the cycle waits for it,
    # within a bounded grace, before it reads the job (app/cycles/steps/wait_for_job.py).
    log_received_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    def take_preparation(self, prepared: JobPreparation) -> None:
        """Run where this host prepared it: its export, its venv and that venv's record."""
        self.workdir, self.venv_path = prepared.workdir, prepared.venv_path
        self.environment = prepared.environment


class JobPreparation(OpsBase):
    """One GPU host's preparation of one job: its clean export and venv on that host. A worker
    leases only jobs prepared on its own host; any host of the job's kind may prepare it."""

    __tablename__ = "job_preparation"
    __table_args__ = (UniqueConstraint("job_id", "host"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(255))
    state: Mapped[str] = mapped_column(String(16), default="preparing")  # lifecycle.PREPARATION
    workdir: Mapped[str | None] = mapped_column(String(1024))
    venv_path: Mapped[str | None] = mapped_column(String(1024))
    # While its venv builds, the build's progress ({"state": "building", "packages", ...}); once
    # ready, the environment record the job takes when this host leases it.
    environment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


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
    # Its process on its host: a gang's leader checks its members are alive by it (an idle
    # worker does not heartbeat).
    pid: Mapped[int | None] = mapped_column(Integer)


class GangSeat(OpsBase):
    """A GPU of a several-GPU job held by a worker other than the job's leader (who holds the
    job's `Lease`): taken with the lease in one transaction, gone with it (app/jobs/gangs.py).
    A seated worker leases nothing else."""

    __tablename__ = "gang_seat"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("job.id", ondelete="CASCADE"), index=True)
    worker: Mapped[str] = mapped_column(String(255), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    device: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class QueueLock(OpsBase):
    """One row per lock name. Leasing updates it first, which serialises leasers on both back ends,
    so two workers can never both see room under a budget and both take a GPU."""

    __tablename__ = "queue_lock"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    counter: Mapped[int] = mapped_column(Integer, default=0)
