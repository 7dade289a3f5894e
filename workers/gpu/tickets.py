"""What the GPU loop knows of itself and of each job it runs (read once at lease time), and
the outcome it records of a run."""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.clock import utcnow
from app.jobs import paths
from app.jobs.lifecycle import End
from app.jobs.service import JobOutcome
from app.settings import Settings
from workers.launcher import runner

if TYPE_CHECKING:
    from app.jobs.models import Job, JobPreparation


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


@dataclass
class WorkerIdentity:
    name: str
    kind: str
    device: str  # what CUDA_VISIBLE_DEVICES gets; "" on a CPU worker
    host: str = field(default_factory=socket.gethostname)

    @property
    def queue(self) -> str:
        return f"gpu.{self.kind}"

    @classmethod
    def for_device(cls, kind: str, device: str) -> WorkerIdentity:
        host = socket.gethostname()
        return cls(name=f"gpu-{kind}-{device or 'x'}@{host}", kind=kind, device=device, host=host)


def first_line_time(reported: Any, *, lower: float | None, upper: float) -> float:
    """When the job's first line of user code ran, as a wall-clock timestamp.

    The `started` event may carry `at` (the job's `time.time()`, same host): used when it lies
    between the spawn and now, so the parent's own delay in reading the event is not counted
    as idle GPU time. Otherwise, the moment the event was read.
    """
    if (
        isinstance(reported, int | float)
        and not isinstance(reported, bool)
        and lower is not None
        and lower <= reported <= upper
    ):
        return float(reported)
    return upper


@dataclass
class Ticket:
    """What the GPU path needs of a job, read once at lease time."""

    job_id: int
    experiment: str
    workdir: str
    venv: str
    spec: dict[str, Any]  # what the experiment sees
    time_limit_s: float
    #: Reserved while the previous job ran (app/jobs/reservations.py): `reserved` until it is
    #: handed over and `reservations.start_reserved` marks it running.
    reserved: bool = False
    #: GPUs it runs on; a job of several has its gang's devices here (app/jobs/gangs.py), a
    #: one-GPU job runs on its worker's (None).
    gpus: int = 1
    devices: str | None = None
    #: The job's attempts when it was leased or reserved (a reservation's claim, `claims.py`).
    attempt: int = 0

    def device_env(self, worker_device: str) -> str | None:
        """CUDA_VISIBLE_DEVICES of its runs: its gang's devices, or its worker's."""
        return self.devices if self.devices is not None else (worker_device or None)

    @classmethod
    def of(
        cls, job: Job, prepared: JobPreparation | None = None, *, reserved: bool = False
    ) -> Ticket:
        """The leased job (its row holds where it runs), or one waiting with this host's
        preparation of it."""
        where = prepared or job
        return cls(
            job_id=job.id,
            experiment=str(job.experiment),
            workdir=str(where.workdir),
            venv=str(where.venv_path),
            spec=dict(job.spec),
            time_limit_s=job.time_limit_s,
            reserved=reserved,
            gpus=job.gpus or 1,
            attempt=job.attempts or 0,
        )


def job_outcome(
    settings: Settings,
    ticket: Ticket,
    outcome: runner.Outcome | None,
    error: str | None,
    cancelled: bool,
    log_path: Path,
) -> JobOutcome:
    """The job's outcome as the worker records it, from what the runner saw: what ended the
    run (the lifecycle makes the job's state of it). No runner outcome: it never started."""
    if outcome is None:
        return JobOutcome(ended=End.FAILED_START, error=error, log_path=str(log_path))
    result = outcome.result if isinstance(outcome.result, dict) else None
    if result is not None:
        # The worker's record, not the child's: whatever the job wrote under this key.
        result = {**result, "sandbox": settings.sandbox}
    ended, message = End.COMPLETED, None
    if cancelled:
        ended, message = End.CANCELLED, "cancelled while running; its process group was killed"
    elif outcome.timed_out:
        ended, message = End.TIMED_OUT, f"time limit of {ticket.time_limit_s:g} s exceeded"
    elif outcome.returncode != 0:
        ended = End.FAILED
        message = f"exited with {outcome.signal or outcome.returncode}: " + (
            last_line(outcome.stderr) or last_line(outcome.stdout) or "no output"
        )
    elif outcome.result_error:
        ended, message = End.FAILED, outcome.result_error
    elif result is not None and result.get("status") == "error":
        ended, message = End.FAILED, f"experiment error: {result.get('error')}"
    result_path = None
    if result is not None:
        saved = paths.job_dir(settings, ticket.job_id) / "result.json"
        saved.write_text(json.dumps(result, indent=2))
        result_path = str(saved)
    return JobOutcome(
        ended=ended,
        exit_code=outcome.returncode,
        error=message,
        result=result,
        result_path=result_path,
        log_path=str(log_path),
        gpu_seconds=outcome.duration_s * ticket.gpus,  # N GPUs held: N x its time
        # when the GPU was free: the job's exit, not this bookkeeping after it
        finished_at=(
            datetime.fromtimestamp(outcome.exited_at, UTC)
            if outcome.exited_at is not None
            else utcnow()
        ),
    )
