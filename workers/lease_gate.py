"""When a GPU worker stops taking jobs: at its drain, and past its deadline.

*The drain.* SIGTERM is Celery's warm shutdown: the worker finishes the task in hand and exits.
A GPU worker's task is its loop over the queue (`gpu/loop.py`, `RunLoop.run_available`), which
would go on leasing job after job; so the shutdown closes this gate, and the loop ends at the
running job's end: its outcome stored, its reservation given back, nothing new leased. That is
what systemd, Kubernetes and the Slurm script (`deploy/slurm/`) send to stop a worker without
losing a job.

*The deadline* (`autopilot worker gpu --deadline`, `AUTOPILOT_WORKER_DEADLINE`): a host that is
only lent, such as a Slurm allocation, ends at a known time. Past `deadline - time_limit_s` the
worker takes no job whose time limit would run past it: the job stays queued, in its place, for
another host. Jobs are taken in the queue's order, so a worker that finds the first job in line
too long for what is left stops there rather than take a shorter one from behind it.

A job is checked *after* it was leased or reserved, in the same transaction: `check` raises
`PastDeadline`, the transaction rolls back, and the lease never was (its attempts unchanged).
Checking first would race another worker that takes the job looked at in between.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

log = logging.getLogger(__name__)

DEADLINE_FORM = (
    "epoch seconds (e.g. 1767225600) or an ISO 8601 time with its UTC offset "
    "(e.g. 2026-01-01T00:00:00Z)"
)


class PastDeadline(Exception):
    """A job's time limit would run past the worker's deadline: not taken."""

    def __init__(self, job_id: int, time_limit_s: float, deadline: float) -> None:
        left = max(0.0, deadline - time.time())
        super().__init__(
            f"job {job_id} not taken: its time limit of {time_limit_s:g} s runs past this "
            f"worker's deadline ({_iso(deadline)}, {left:.0f} s from now); it stays queued"
        )
        self.job_id = job_id


def parse_deadline(text: str) -> float:
    """An absolute deadline as epoch seconds; ValueError naming the expected form otherwise.

    A time without a UTC offset is refused: the worker and whoever computed the deadline (a
    batch script on another machine's clock settings) must not disagree by a time zone."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: expected {DEADLINE_FORM}") from None
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset: expected {DEADLINE_FORM}")
    return parsed.timestamp()


@dataclass
class LeaseGate:
    """Whether this worker may take a job now: one per process (`GATE`), set at start."""

    deadline: float | None = None  # epoch seconds; None: no deadline
    _draining: threading.Event = field(default_factory=threading.Event)

    def drain(self) -> None:
        """Take no more jobs (from a signal handler too: it only sets an event)."""
        self._draining.set()

    @property
    def draining(self) -> bool:
        return self._draining.is_set()

    def fits(self, time_limit_s: float, now: float | None = None) -> bool:
        """Whether a job of `time_limit_s` started now ends by the deadline (if any)."""
        if self.deadline is None:
            return True
        return (time.time() if now is None else now) + time_limit_s <= self.deadline

    def admits(self, time_limit_s: float, now: float | None = None) -> bool:
        """Whether a job of `time_limit_s` may start now: not draining, and it fits."""
        return not self.draining and self.fits(time_limit_s, now)

    def check(self, job_id: int, time_limit_s: float) -> None:
        """Raise PastDeadline unless the job fits (call it inside the transaction that leased
        or reserved it, so that raising undoes that)."""
        if self.deadline is not None and not self.fits(time_limit_s):
            raise PastDeadline(job_id, time_limit_s, self.deadline)


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


#: This process's gate: `autopilot worker gpu` sets its deadline, the shutdown drains it.
GATE = LeaseGate()
