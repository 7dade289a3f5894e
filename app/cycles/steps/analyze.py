"""analyzing → committing: lesson 4, the harness's verdict decides, accuracy gate first."""

from __future__ import annotations

from app.cycles import repository, service
from app.cycles.headline import headline
from app.cycles.steps.base import Step
from app.jobs import service as jobs


class Analyze(Step):
    FROM_STATES = ("analyzing",)
    TO_STATES = ("committing", "failed")

    def run(self, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            job = jobs.for_cycle(session, cycle_id)
            result = (job.result if job else None) or {}
            if result.get("status") != "ok":
                error = "the experiment produced no result"
                repository.set_state(session, cycle, "failed", error=error)
                return True
            cycle.verdict = str(result.get("verdict") or "inconclusive")
            cycle.headline = headline(result)
            repository.set_state(session, cycle, "committing")
        return True
