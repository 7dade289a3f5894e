"""queued | running → analyzing (or its end): follow the cycle's job; wait while it waits or
runs, and once it has ended, until its whole log has arrived from its GPU host (within a
grace). Its GPU is free once it ends, so the project's oldest deferred cycle may go now."""

from __future__ import annotations

from datetime import datetime

from app import broker
from app.clock import aware, utcnow
from app.cycles import repository, schedules, service
from app.cycles.steps.base import Step
from app.jobs import service as jobs
from app.jobs.lifecycle import WAITING
from app.jobs.models import Job

#: How long after its job ended a cycle waits for the job's whole log, measured from the job's
#: `finished_at`. The GPU host uploads it right after the outcome (within milliseconds), and a
#: host that died in between sends it when a worker starts there again, which may be never: past
#: the grace the cycle goes on with the tail the DB keeps (the log still lands when it comes).
#: The upload rings the cycle; without it, the reaper re-rings a cycle whose job ended at
#: `doorbell_stale_s` and at twice that (30 s and 60 s by default), so a ring comes after it.
LOG_GRACE_S = 60.0


def log_pending(job: Job, now: datetime) -> bool:
    """Whether the ended job's whole log is still on its way: its worker stored an outcome (a
    job never run, or given up by the reaper, has no log to send) and the grace is not over."""
    if job.log_path is None or job.log_received_at is not None:
        return False
    finished = aware(job.finished_at)
    return finished is not None and (now - finished).total_seconds() < LOG_GRACE_S


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
            if job.state in WAITING or log_pending(job, utcnow()):
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
