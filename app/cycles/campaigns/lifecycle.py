"""A campaign's lifecycle and its steps', tables of the one primitive (`app/statemachine.py`).

    running ──a limit, or a stop──► finishing ──its PR, or nothing kept──► finished | stopped
       └──────────────────────────────┴──────► failed   (a move raised an error that stays)

A step (a cycle at the line's tip) is decided once it is judged: `discarded`, or `confirmed` by
its confirmation cycle, and then `kept` (the round's best: the line advances to it) or
`discarded` (superseded). Its `outcome` column is NULL while it is undecided (`pending`).
`driver.py` makes every move, through `CAMPAIGN.move` and `STEP.move`.
"""

from __future__ import annotations

from typing import get_args

from app.cycles.campaigns.schemas import CampaignState
from app.statemachine import Lifecycle, Move

#: Every state of a campaign, in the order it moves through them.
STATES: tuple[str, ...] = ("running", "finishing", "finished", "stopped", "failed")
assert get_args(CampaignState) == STATES
#: Its driver still has moves to make.
LIVE = ("running", "finishing")
#: Nothing more will happen to it (but a reviewer's decision on its pull request).
ENDS = ("finished", "stopped", "failed")

CAMPAIGN = Lifecycle(
    "campaign",
    STATES,
    (
        Move(
            ("running",),
            ("finishing",),
            "Driver._next_round",
            "a limit is reached (its cycles, its hours, rounds with no gain) or a person asked "
            "it to stop: no new round, the line is measured and proposed",
        ),
        Move(
            ("finishing",),
            ("finished",),
            "Driver._finish, Driver._open_pull_request",
            "its line's pull request is open and its findings recorded, or nothing was kept",
        ),
        Move(
            ("finishing",),
            ("stopped",),
            "Driver._finish, Driver._open_pull_request",
            "as finished, for a campaign a person asked to stop",
        ),
        Move(
            LIVE,
            ("failed",),
            "Driver._fail",
            "a move raised an error that does not pass (a bad request, a bug): its live cycles "
            "are cancelled",
        ),
    ),
    final=ENDS,
)

#: What became of a step: undecided (`pending`: NULL), then as the module docstring says.
STEP_OUTCOMES: tuple[str, ...] = ("pending", "confirmed", "kept", "discarded")

STEP = Lifecycle(
    "campaign step",
    STEP_OUTCOMES,
    (
        Move(
            ("pending",),
            ("discarded",),
            "Driver._judge_step",
            "its cycle (or its confirmation) ended without a judged result, changed nothing, "
            "lost, or won with the campaign stopped before it was confirmed",
        ),
        Move(
            ("pending",),
            ("confirmed",),
            "Driver._judge_step",
            "it won, and its confirmation cycle agrees: the keep rule would keep it",
        ),
        Move(
            ("confirmed",),
            ("kept",),
            "Driver._keep_best",
            "the round's best confirmed step: the line advances to its commit",
        ),
        Move(
            ("confirmed",),
            ("discarded",),
            "Driver._keep_best",
            "superseded by the round's best (the line takes one candidate per tip)",
        ),
    ),
    attr="outcome",
    final=("kept", "discarded"),
    blank="pending",
)
