"""queued | running → analyzing (or its end): follow the cycle's job; wait while it waits or
runs. Its GPU is free once it ends, so the project's oldest deferred cycle may go now."""

from __future__ import annotations

from app import broker
from app.cycles import repository, schedules, service
from app.cycles.steps.base import Step
from app.jobs import service as jobs


class WaitForJob(Step):
    FROM_STATES = ("queued", "running")
    TO_STATES = ("running", "analyzing", "cancelled", "failed")

    def run(self, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            job = jobs.for_cycle(session, cycle_id)
            if job is None:
                repository.set_state(session, cycle, "failed", error="the cycle's job is missing")
                return True
            if job.state in ("leased", "running"):
                if cycle.state != "running":
                    repository.set_state(session, cycle, "running")
                return False
            if job.state == "queued":
                return False
            cycle.gpu_seconds = job.gpu_seconds
            if job.state == "succeeded":
                repository.set_state(session, cycle, "analyzing")
            elif job.state == "cancelled":
                repository.set_state(session, cycle, "cancelled", error="its job was cancelled")
            else:
                error = f"job {job.id} failed: {job.error}"
                repository.set_state(session, cycle, "failed", error=error)
            # A peak budget frees with every job: resume now rather than at the next tick.
            resumed = schedules.resume_deferred(session, self.settings, cycle.project_id, limit=1)
        for other in resumed:
            broker.ring_advance(self.settings, other)
        return True
