"""preparing → queued: the cycle's worktree and branch, its candidate commit (the agent's
change, or the base itself) pushed to the forge, then its job naming that commit; all before
any GPU is asked for. GPU hosts fetch the commit from the forge (DESIGN.md, "Hosts and
boundaries"); the job's doorbell rings only after the job is committed."""

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
        git = self.git()
        try:
            worktree = self.worktree(cycle, ref, forge)
            # Code travels as a commit: what the agent changed (checked against the protected
            # paths) is committed on the cycle's branch and pushed before any host fetches it.
            head = git.commit(
                worktree, f"Candidate of cycle {cycle.id}\n\n{cycle.hypothesis or ''}"
            )
            git.push(worktree, forge.remote_url(ref))
        except (Unavailable, OSError) as exc:
            raise Transient(str(exc)) from exc
        config = project_config.load(worktree.path)
        source = jobs.JobSource(
            repo=forge.fetch_url(ref),
            ref=worktree.branch,
            head_sha=head,
            base_sha=worktree.base_sha,
        )
        ring: str | None = None
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
                    source=source,
                )
                ring = job.queue
            repository.set_state(session, cycle, "queued")
        if ring is not None:
            broker.ring_gpu(self.settings, ring)  # after the commit
        return True
