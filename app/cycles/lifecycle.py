"""A cycle's lifecycle: the moves allowed between its states (`app/cycles/states.py`), why each
exists, and the one function through which every state change goes (`move`, which
`repository.set_state` calls). A move the table does not hold is refused with `IllegalMove`,
naming the cycle and both states: a step that finds its cycle cancelled under it cannot carry
it on.

The steps' moves are each step's FROM_STATES x TO_STATES (`app/cycles/steps/`; a test checks
that the table holds exactly those); the others are made by the machine, a person or the
schedule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.clock import utcnow
from app.cycles.states import ALL, LIVE, TERMINAL
from app.errors import Conflict

if TYPE_CHECKING:
    from app.cycles.models import Cycle


@dataclass(frozen=True)
class Move:
    """Moves from each of `frm` to each of `to`, who makes them (a step's class name, or who
    else) and why they exist."""

    frm: tuple[str, ...]
    to: tuple[str, ...]
    by: str
    why: str


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

ALLOWED: dict[tuple[str, str], list[Move]] = {}
for _move in MOVES:
    for _frm in _move.frm:
        for _to in _move.to:
            ALLOWED.setdefault((_frm, _to), []).append(_move)
assert all(f in ALL and t in ALL and f != t for f, t in ALLOWED), "a move names no state"
assert not {f for f, _ in ALLOWED} & set(TERMINAL), "an end is left"


class IllegalMove(Conflict):
    slug = "illegal-cycle-move"
    title = "Cycle cannot make that move"


def allows(frm: str, to: str) -> bool:
    """Whether a cycle in `frm` may move to `to`."""
    return (frm, to) in ALLOWED


def move(cycle: Cycle, to: str, error: str | None = None) -> None:
    """Move `cycle` to `to` (recording `error`, when given, as why it ended); `IllegalMove`,
    naming the cycle and both states, when the table holds no such move. The one place a
    cycle's state is set."""
    frm = cycle.state
    if not allows(frm, to):
        onward = sorted({t for f, t in ALLOWED if f == frm})
        then = (
            f"from {frm} it may only become {', '.join(onward)}" if onward else f"{frm} is an end"
        )
        raise IllegalMove(
            f"cycle {cycle.id} cannot move from {frm} to {to}: {then}",
            from_state=frm,
            to_state=to,
        )
    cycle.state, cycle.updated_at = to, utcnow()
    if error is not None:
        cycle.error = error
