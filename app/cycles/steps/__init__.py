"""The cycle's steps in the order they run: Plan, Prepare, WaitForJob, Analyze, Commit,
Publish. Each names the states it runs from (FROM_STATES) and may leave the cycle in
(TO_STATES); `machine.py` looks a cycle's state up here and runs that step. The whole table of
moves, with who makes the others (the machine, a reviewer, the schedule) and why each exists, is
`app/cycles/lifecycle.MOVES`; a test checks the steps' declarations against it.
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
