"""A local pull request's lifecycle (the local forge's records), a table of the one primitive
(`app/statemachine.py`): opened `open`, then closed or merged by `local.LocalForge`.
"""

from __future__ import annotations

from typing import get_args

from app.forge.base import PullRequestState
from app.statemachine import Lifecycle, Move

#: Every state of a pull request.
STATES: tuple[str, ...] = get_args(PullRequestState)

PULL_REQUEST = Lifecycle(
    "pull request",
    STATES,
    (
        Move(("open",), ("closed",), "LocalForge.close", "closed without merging (a rejection)"),
        Move(("open",), ("merged",), "LocalForge.merge", "its head was merged into its base"),
        Move(
            ("closed", "merged"),
            ("merged",),
            "LocalForge.merge",
            "it was closed, or merged by another call, while this merge was made: the base "
            "branch holds this merge commit now, and the record follows git",
        ),
    ),
)
