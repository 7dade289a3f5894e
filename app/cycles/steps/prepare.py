"""preparing → queued: the cycle's worktree and branch, then its job; all before any GPU is
asked for. The job's "prepare" doorbell rings only after the job is committed."""

from __future__ import annotations

from app import broker
from app.cycles import repository, service
from app.cycles.exceptions import Transient
from app.cycles.steps.base import Step
from app.errors import Unavailable
from app.forge import service as forge_service
from app.jobs import service as jobs
from app.projects import config as project_config


class Prepare(Step):
    FROM_STATES = ("preparing",)
    TO_STATES = ("queued",)

    def run(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref = self.detached(cycle_id)
        try:
            worktree = self.worktree(cycle, ref, forge)
        except (Unavailable, OSError) as exc:
            raise Transient(str(exc)) from exc
        config = project_config.load(worktree.path)
        ring: int | None = None
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.worktree, cycle.branch = str(worktree.path), worktree.branch
            cycle.base_sha = worktree.base_sha
            if jobs.for_cycle(session, cycle_id) is None:  # not made before a crash
                job = jobs.submit(
                    session,
                    self.settings,
                    service.project_of(session, cycle),
                    config,
                    str(cycle.experiment),
                    dict(cycle.parameters or {}),
                    cycle_id=cycle.id,
                )
                job.workdir = str(worktree.path)
                ring = job.id
            repository.set_state(session, cycle, "queued")
        if ring is not None:
            broker.ring_prepare(self.settings, ring)  # after the commit
        return True
