"""The jobs domain's lifecycles: a job's states, the moves allowed between them and why each
exists, and the one function through which every state change goes; and a host's preparation of
a job (`PREPARATION`). Both are tables of the one primitive, `app/statemachine.py`.

    queued ──claim──► leased ──start──► running ──end──► succeeded | failed | cancelled
    queued ◄─requeue── leased, running        (its lease lapsed: the reaper gives it back)
    queued ──reserve─► reserved ──hand-over─► running  (a busy worker runs it next)
                       reserved ──takeover──► leased   (an idle worker of its host took it)
    queued ◄─give back─ reserved              (released, or lapsed: it never ran)
    queued, reserved ──► failed | cancelled   (never started: refused, or cancelled waiting)

Callers say what happened; this module decides the state. A GPU worker reports an `Outcome`
(what ended the run: it completed, failed, timed out, was cancelled, could not start, lost its
lease); `state_after` turns it into the job's final state. Every move is in `MOVES`, with who
makes it and why; `move` makes one (refusing with `IllegalMove`, naming the job and both states,
one the table does not hold), and `guarded` gives the repository the two that race as
conditional UPDATEs (a claim, which may take a reserved job over; a reserved job's hand-over).

A *reserved* job is one a busy worker runs next on its GPU (app/jobs/reservations.py): it keeps
its place in line and has not started. Its state is written with its reservation, in the one
UPDATE that records where it will run, so the hand-over at the reserver's job's end writes no
more than before: its conditional UPDATE expects `reserved` where it expected `queued`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, get_args

from app.clock import utcnow
from app.statemachine import Guarded, Lifecycle, Move

if TYPE_CHECKING:
    from app.jobs.models import Job


class JobState(StrEnum):
    QUEUED = "queued"  # waiting for a GPU
    RESERVED = "reserved"  # a busy worker runs it next on its GPU (app/jobs/reservations.py)
    LEASED = "leased"  # a worker holds its lease and is starting it
    RUNNING = "running"  # its process runs on the worker's GPU
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Every state, in the order a job moves through them.
JOB_STATES: tuple[JobState, ...] = tuple(JobState)
#: Not started yet, in its place in line: waiting for a GPU, or reserved by a busy worker.
WAITING: tuple[JobState, ...] = (JobState.QUEUED, JobState.RESERVED)
#: Holding a GPU.
ACTIVE: tuple[JobState, ...] = (JobState.LEASED, JobState.RUNNING)
#: Nothing more will happen to it.
FINISHED: tuple[JobState, ...] = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
#: The states as a type, for the API's filter: another value is a 422, not an empty list.
StateName = Literal["queued", "reserved", "leased", "running", "succeeded", "failed", "cancelled"]
assert get_args(StateName) == JOB_STATES


_Q, _V, _L, _R = JobState.QUEUED, JobState.RESERVED, JobState.LEASED, JobState.RUNNING
_S, _F, _C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

#: Every move a job may make, in the order of its life. Nothing leaves a finished state.
MOVES: tuple[Move, ...] = (
    Move((_Q,), (_L,), "repository.claim", "a worker claimed it under the leasing lock"),
    Move(
        (_Q,),
        (_V,),
        "reservations.reserve_next",
        "a busy worker reserved it, under the leasing lock, to run next on its GPU",
    ),
    Move(
        (_V,),
        (_L,),
        "repository.claim",
        "an idle worker of its host took it over before its reserver started it",
    ),
    Move((_V,), (_R,), "repository.promote", "its worker handed the job it reserved over"),
    Move(
        (_V,),
        (_Q,),
        "reservations.release, reaping.reap",
        "its reserver gave it back (draining, past its deadline, unrenewed), or the "
        "reservation lapsed: it never ran, and waits in its place again",
    ),
    Move(
        (_Q,),
        (_F,),
        "service.fail_unstarted",
        "refused before it started: no host could prepare it",
    ),
    Move((_V,), (_F,), "service.finish", "its reserved run never began (a failed start)"),
    Move((_Q, _V), (_C,), "service.cancel", "cancelled while it waited"),
    Move((_L,), (_R,), "service.mark_running", "its process started"),
    Move(
        (_L, _R),
        (_Q,),
        "reaping.give_back (the reaper; a gang's leader)",
        "its lease lapsed (the worker stopped heartbeating), or a member of its gang died: "
        "given back for another attempt",
    ),
    Move((_L, _R), (_S,), "service.finish", "its run completed"),
    Move(
        (_L, _R),
        (_F,),
        "service.finish, reaping.give_back",
        "its run failed, timed out or never started; or its lease lapsed (or a member of its "
        "gang died) after its last attempt",
    ),
    Move(
        (_L, _R),
        (_C,),
        "service.finish, reaping.reap",
        "cancelled while it ran; or its lease lapsed after someone asked to cancel it",
    ),
)

JOB = Lifecycle("job", JOB_STATES, MOVES, final=FINISHED)
#: (from, to) -> the move that makes it.
ALLOWED = JOB.allowed
assert all(len(made) == 1 for made in ALLOWED.values()), "a move listed twice"


class End(StrEnum):
    """What ended a run, as the worker saw it. The worker reports this, never a state."""

    COMPLETED = "completed"  # exited 0 with a result that is not an error
    FAILED = "failed"  # exited non-zero, reported an error, or its result was unreadable
    TIMED_OUT = "timed_out"  # killed at its time limit
    CANCELLED = "cancelled"  # someone asked to cancel it; its processes were killed
    FAILED_START = "failed_start"  # never ran: launch refused, its files could not be written
    LEASE_LOST = "lease_lost"  # the worker lost its lease (or reservation) before it ran


@dataclass
class Outcome:
    """What a worker records of a job it ran (or tried to): `finish` stores it."""

    ended: End
    exit_code: int | None = None
    error: str | None = None
    result: dict[str, Any] | None = None
    result_path: str | None = None
    log_path: str | None = None
    log_tail: str | None = None
    gpu_seconds: float = 0.0
    finished_at: datetime = field(default_factory=utcnow)


def state_after(ended: End) -> JobState:
    """The final state of a job whose run ended so."""
    if ended is End.COMPLETED:
        return JobState.SUCCEEDED
    if ended is End.CANCELLED:
        return JobState.CANCELLED
    return JobState.FAILED


def move(job: Job, to: JobState, **fields: Any) -> None:
    """Move `job` to `to`, setting `fields` with it (its error, its times...); `IllegalMove`,
    naming both states, when the table holds no such move. The one place a job's state is set.
    """
    JOB.move(job, to, **fields)


def guarded(frm: JobState | tuple[JobState, ...], to: JobState) -> Guarded:
    """The racing form of a move, checked against the table (at import, where the repository
    builds it): the states it may start from and the state it sets."""
    return JOB.guarded(frm, to)


# -- a host's preparation of a job --------------------------------------------------------------

#: A host's preparation of a job: its export and venv being made, made, or refused there. Its
#: row is made `preparing` (`preparation.claim_preparation`); `PREPARATION.move` moves it on.
PREPARATION_STATES = ("preparing", "ready", "failed")

PREPARATION = Lifecycle(
    "job preparation",
    PREPARATION_STATES,
    (
        Move(
            ("preparing",),
            ("ready",),
            "preparation.preparation_ready",
            "its export and venv are made on the host: a worker of that host may lease the job",
        ),
        Move(
            ("preparing",),
            ("failed",),
            "preparation.preparation_failed",
            "the host could not prepare it; other hosts of its kind still may",
        ),
    ),
    final=("ready", "failed"),
)
