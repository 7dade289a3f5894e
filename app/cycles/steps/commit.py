"""committing → publishing: the judged result and its report, committed on the cycle's branch.

What is committed is the control plane's judgement of the job's raw result (`judge.py`, the
same pure computation Analyze made, so it is the verdict the cycle holds); REPORT.md warns
where the experiment's self-report disagreed with it."""

from __future__ import annotations

from app.cycles import repository, service
from app.cycles.pull_request import report_context
from app.cycles.steps.base import Step
from app.forge import service as forge_service


class Commit(Step):
    FROM_STATES = ("committing",)
    TO_STATES = ("publishing",)

    def run(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref, _, result = self.judged(cycle_id)
        branch = self.branch(cycle, ref, forge)
        sha = forge_service.commit_results(self.git(), branch, result, report_context(cycle, ref))
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.commit_sha = sha
            repository.set_state(session, cycle, "publishing")
        return True
