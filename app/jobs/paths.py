"""Where a job's files live on the host that runs it: one layout, read by the API and the CLI,
written by the GPU worker."""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings

LOG_NAME = "job.log"
# How much of a running job's log the ops DB keeps (`Job.log_tail`): what the control host shows
# of a job on another machine until its whole log is uploaded when it ends.
LOG_TAIL_BYTES = 64 * 1024


def job_dir(settings: Settings, job_id: int) -> Path:
    return settings.state_dir.absolute() / "jobs" / str(job_id)


def launch_config(settings: Settings, job_id: int) -> Path:
    """The job's autopilot.toml as its preparation read it from the fresh export, before any
    project code ran: what the runner launches by (the export itself is the job's to write)."""
    return job_dir(settings, job_id) / "autopilot.toml"


def source_dir(settings: Settings, job_id: int) -> Path:
    """The clean export of the job's commit, on the host that prepared it."""
    return job_dir(settings, job_id) / "src"


def baseline_dir(settings: Settings, job_id: int) -> Path:
    """A command experiment's baseline arm: the clean export of the job's base commit."""
    return job_dir(settings, job_id) / "base"


def arms_path(settings: Settings, job_id: int) -> Path:
    """Where a command job's arms were prepared on this host (trees, venvs, commits): written by
    its preparation, read by the worker that runs it."""
    return job_dir(settings, job_id) / "arms.json"


def runs_dir(settings: Settings, job_id: int) -> Path:
    """Each run's log of a command job."""
    return job_dir(settings, job_id) / "runs"


def log_path(settings: Settings, job_id: int, recorded: str | None = None) -> Path:
    """The job's log: the path its worker recorded, else where the layout puts it."""
    return Path(recorded) if recorded else job_dir(settings, job_id) / LOG_NAME
