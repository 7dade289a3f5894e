"""The states of a cycle, grouped once; everyone who asks "is it over?" imports them from here.

planned → preparing → queued → running → analyzing → committing → publishing → awaiting_review
→ approved | rejected; other ends: skipped_repeat, deferred_budget, failed, cancelled. A
campaign's cycle ends `judged` after analyzing: its campaign, not a reviewer, takes it on. The moves
allowed between them, and the one function that makes them, are `lifecycle.py`'s.
"""

from __future__ import annotations

from typing import Literal, get_args

TERMINAL = ("approved", "rejected", "judged", "skipped_repeat", "failed", "cancelled")
WAITING = ("awaiting_review", "deferred_budget")
# Where a follower (the CLI, the demo) stops watching: an end, or a wait on a person or budget.
SETTLED = (*TERMINAL, *WAITING)
LIVE = ("planned", "preparing", "queued", "running", "analyzing", "committing", "publishing")
# A step runs from these by itself; a cycle in one that no one has touched for a while lost
# its doorbell.
STEPPING = ("planned", "preparing", "analyzing", "committing", "publishing")
# The cycle waits on its job; the job's end rings it on.
ON_JOB = ("queued", "running")
# A fingerprint held by one of these is taken: a second cycle would repeat it.
HOLDS_FINGERPRINT = (*LIVE, "awaiting_review")
# Every state, as a type: an API filter with another value is a 422, not an empty list.
CycleState = Literal[
    "planned",
    "preparing",
    "queued",
    "running",
    "analyzing",
    "committing",
    "publishing",
    "awaiting_review",
    "deferred_budget",
    "approved",
    "rejected",
    "judged",
    "skipped_repeat",
    "failed",
    "cancelled",
]
ALL = get_args(CycleState)
assert set(ALL) == {*LIVE, *SETTLED}
