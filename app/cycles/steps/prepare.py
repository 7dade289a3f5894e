"""preparing → queued: the cycle's branch, its candidate commit (the agent's checked commits,
or the base itself) pushed to the forge, then its job naming that commit; all before any GPU
is asked for. GPU hosts fetch the commit from the forge (docs/design.md, "Hosts and
boundaries"); the job's doorbell rings only after the job is committed."""

from __future__ import annotations

from app import broker
from app.cycles import repository, service
from app.cycles.campaigns.context import FIXED_ROLES
from app.cycles.exceptions import Transient
from app.cycles.steps.base import Step
from app.errors import Unavailable
from app.forge import service as forge_service
from app.jobs import service as jobs


class Prepare(Step):
    FROM_STATES = ("preparing",)
    TO_STATES = ("queued",)

    def run(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref = self.detached(cycle_id)
        git = self.git()
        try:
            branch = self.branch(cycle, ref, forge)
            if cycle.role in FIXED_ROLES and cycle.candidate_sha:
                # A campaign's confirmation or final measurement: the commit it runs is made.
                git.move_branch(branch, cycle.candidate_sha)
            # Code travels as a commit: the branch's tip (the agent's commits, taken and checked
            # in the plan step, or the base) is on the forge before any host fetches it. The
            # base alone (a sweep's point) is there already: the forge just names it, if it can.
            head = git.tip(branch)
            if head != branch.base_sha or not forge.place_branch(ref, branch.branch, head):
                head = git.push(branch, forge.remote_url(ref))
        except (Unavailable, OSError) as exc:
            raise Transient(str(exc)) from exc
        config = forge_service.config_at_commit(git, ref.name, head, branch.branch)
        source = jobs.JobSource(
            repo=forge.fetch_url(ref),
            ref=branch.branch,
            head_sha=head,
            base_sha=branch.base_sha,
        )
        ring: str | None = None
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.branch, cycle.base_sha = branch.branch, branch.base_sha
            cycle.candidate_sha = head  # what a campaign keeps, if it keeps this cycle's
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
