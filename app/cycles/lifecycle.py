"""The cycles domain's lifecycles, tables of the one primitive (`app/statemachine.py`).

A cycle's: the moves allowed between its states (`app/cycles/states.py`), why each exists, and
the one function through which every state change goes (`move`, which `repository.set_state`
calls). A move the table does not hold is refused with `IllegalMove`, naming the cycle and both
states: a step that finds its cycle cancelled under it cannot carry it on. The steps' moves are
each step's FROM_STATES x TO_STATES (`app/cycles/steps/`; a test checks that the table holds
exactly those); the others are made by the machine, a person or the schedule.

A step attempt's (`ATTEMPT`, a row of the cycle's audit trail): begun `started`, ended by the
machine, and started again when it waited. The repository writes those moves as conditional
UPDATEs (`ATTEMPT.guarded`): the machine begins and ends every step of every cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.clock import utcnow
from app.cycles.states import ALL, LIVE, TERMINAL
from app.statemachine import Lifecycle, Move

if TYPE_CHECKING:
    from app.cycles.models import Cycle


#: Where a person may cancel a cycle from: anywhere it has not ended.
CANCELLABLE = tuple(s for s in ALL if s not in TERMINAL)

#: Every move a cycle may make, in the order of its life. Nothing leaves an end (TERMINAL).
MOVES: tuple[Move, ...] = (
    Move(("planned",), ("preparing",), "Plan", "its proposal is recorded and repeats no finding"),
    Move(
        ("planned",),
        ("skipped_repeat",),
        "Plan",
        "memory holds a verdict for the same point, and no changed hypothesis was stated",
    ),
    Move(
        ("planned",),
        ("deferred_budget",),
        "Plan",
        "the project's GPU or LLM-token budget is spent for now",
    ),
    Move(("deferred_budget",), ("planned",), "schedules", "its project's budgets allow it again"),
    Move(("preparing",), ("queued",), "Prepare", "its commit is on the forge and its job queued"),
    Move(("queued",), ("running",), "WaitForJob", "a GPU worker leased its job"),
    Move(
        ("queued", "running"),
        ("analyzing",),
        "WaitForJob",
        "its job succeeded (perhaps before the cycle saw it run)",
    ),
    Move(("queued", "running"), ("cancelled",), "WaitForJob", "its job was cancelled"),
    Move(("queued", "running"), ("failed",), "WaitForJob", "its job failed, or is missing"),
    Move(("analyzing",), ("committing",), "Analyze", "the control plane judged its result"),
    Move(
        ("analyzing",),
        ("judged",),
        "Analyze",
        "a campaign's cycle is judged: its campaign keeps or discards it, no PR of its own",
    ),
    Move(("analyzing",), ("failed",), "Analyze", "its result is missing or cannot be judged"),
    Move(("committing",), ("publishing",), "Commit", "the judged result is committed"),
    Move(
        ("publishing",),
        ("awaiting_review",),
        "Publish",
        "its pull request is open and its findings proposed",
    ),
    Move(
        ("awaiting_review",),
        ("approved", "rejected"),
        "review",
        "a reviewer decided on its pull request",
    ),
    Move(
        LIVE,
        ("failed",),
        "machine",
        "its step raised an error that cannot pass, or kept failing for one that might",
    ),
    Move(CANCELLABLE, ("cancelled",), "service.cancel", "a person cancelled it"),
)

CYCLE = Lifecycle("cycle", ALL, MOVES, final=TERMINAL)
#: (from, to) -> the moves that make it (`failed` from a step's state: the step, or the machine).
ALLOWED = CYCLE.allowed
assert all(frm != to for frm, to in ALLOWED), "a move that goes nowhere"


def allows(frm: str, to: str) -> bool:
    """Whether a cycle in `frm` may move to `to`."""
    return CYCLE.allows(frm, to)


def move(cycle: Cycle, to: str, error: str | None = None) -> None:
    """Move `cycle` to `to` (recording `error`, when given, as why it ended); `IllegalMove`,
    naming the cycle and both states, when the table holds no such move. The one place a
    cycle's state is set."""
    if error is None:
        CYCLE.move(cycle, to, updated_at=utcnow())
    else:
        CYCLE.move(cycle, to, updated_at=utcnow(), error=error)


# -- a step's attempt ---------------------------------------------------------------------------

#: An attempt at a step: running, or how it ended (`waiting`: it found nothing to do yet, and is
#: the same attempt when the machine checks again).
ATTEMPT_STATES = ("started", "waiting", "retry", "failed", "done")
#: How the machine ends an attempt it started.
ATTEMPT_ENDS = ("done", "waiting", "retry", "failed")

ATTEMPT = Lifecycle(
    "cycle step",
    ATTEMPT_STATES,
    (
        Move(("started",), ("done",), "Machine.advance", "its step moved the cycle"),
        Move(
            ("started",),
            ("waiting",),
            "Machine.advance",
            "its step found nothing to do yet (the cycle waits on its job, a review, a budget)",
        ),
        Move(
            ("started",),
            ("retry",),
            "Machine.advance",
            "its step raised an error that may pass; a later attempt tries again",
        ),
        Move(
            ("started",),
            ("failed",),
            "Machine.advance",
            "its step raised an error that cannot pass, or crashed",
        ),
        Move(
            ("waiting",),
            ("started",),
            "repository.begin_step",
            "the machine checks the waiting step again: the same attempt, started again",
        ),
    ),
    attr="status",
    final=("done", "retry", "failed"),
)
