"""The cycle's steps in the order they run, each naming the states it runs from and the states
it may leave the cycle in. `machine.py` looks a cycle's state up here and runs that step.

| step        | from              | to                                               |
| ----------- | ----------------- | ------------------------------------------------ |
| Plan        | planned           | preparing, skipped_repeat, deferred_budget       |
| Prepare     | preparing         | queued                                           |
| WaitForJob  | queued, running   | running, analyzing, cancelled, failed            |
| Analyze     | analyzing         | committing, failed                               |
| Commit      | committing        | publishing                                       |
| Publish     | publishing        | awaiting_review                                  |

Any step may also end the cycle as `failed` (the machine does, on an error it cannot retry).
A cycle awaiting review moves on by a person (`review.py`); one deferred for budget, by the
schedule (`schedules.py`).
"""

from __future__ import annotations

from app.cycles.steps.analyze import Analyze
from app.cycles.steps.base import Step
from app.cycles.steps.commit import Commit
from app.cycles.steps.plan import Plan
from app.cycles.steps.prepare import Prepare
from app.cycles.steps.publish import Publish
from app.cycles.steps.wait_for_job import WaitForJob

STEPS: tuple[type[Step], ...] = (Plan, Prepare, WaitForJob, Analyze, Commit, Publish)


def _by_state() -> dict[str, type[Step]]:
    table: dict[str, type[Step]] = {}
    for step in STEPS:
        for state in step.FROM_STATES:
            assert state not in table, f"two steps run from {state!r}"
            table[state] = step
    return table


BY_STATE = _by_state()

__all__ = [
    "BY_STATE",
    "STEPS",
    "Analyze",
    "Commit",
    "Plan",
    "Prepare",
    "Publish",
    "Step",
    "WaitForJob",
]
