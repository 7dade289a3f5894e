"""planned → preparing: choose what to run (the trigger's request, or the agent's proposal),
refuse a repeat (lesson 5) and defer a cycle over budget, all before any git or GPU work."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.agents import service as agents
from app.agents import workspace
from app.agents.workspace import Workspace
from app.cycles import repository, service
from app.cycles.exceptions import Transient
from app.cycles.steps.base import Step
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.forge.exceptions import FetchFailed
from app.forge.git import CycleBranch, GitWork
from app.jobs import service as jobs
from app.memory import service as memory
from app.projects.config import ProjectConfig


class Plan(Step):
    FROM_STATES = ("planned",)
    TO_STATES = ("preparing", "skipped_repeat", "deferred_budget")

    def run(self, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            project = service.project_of(session, cycle)
            ref = ProjectRef.of(project)
            gpu_kind, requested = project.gpu_kind, (cycle.experiment, cycle.parameters)
            agent_name, changed = cycle.agent, cycle.changed_hypothesis
            live = repository.live_fingerprints(session, project.id, exclude=cycle_id)
            blocked = jobs.blocked_by_budget(session, self.settings, project)
        if blocked:
            with self.stores.ops_session() as session:
                cycle = service.get(session, cycle_id)
                repository.set_state(session, cycle, "deferred_budget", error=blocked)
            return True
        forge = forge_service.forge_for(self.settings, self.stores)
        try:
            _, config = forge_service.config_at_base(self.git(), forge, ref)
        except FetchFailed as exc:
            raise Transient(exc.detail) from exc
        with self.stores.memory_session() as msession:
            related = [
                {"id": f.id, "kind": f.kind, "statement": f.statement}
                for f in memory.related(msession, ref.name, ref.name, k=8)
            ]

        def covered(experiment: str, parameters: dict[str, Any]) -> bool:
            fp = memory.fingerprint(ref.name, experiment, parameters, gpu_kind)
            if fp in live:
                return True
            with self.stores.memory_session() as msession:
                return memory.check_repeat(msession, fp) is not None

        if requested[0]:
            experiment = config.experiment(requested[0])
            params = experiment.check_parameters(dict(requested[1] or {}))
            proposal = agents.Proposal(
                hypothesis=changed or f"{requested[0]} at {params} on {gpu_kind}",
                experiment=requested[0],
                parameters=params,
                changes=changed or "",
            )
        else:
            context = agents.Context(ref.name, gpu_kind, config, related, is_covered=covered)
            if agent_name == "config":
                agent_name = config.agent.kind
            found = self._agent(cycle_id, agent_name, config).propose(context)
            if found is None:
                raise agents.NothingToPropose(
                    "every point of the declared parameter space has a recorded verdict or a "
                    "live cycle; declare new points or state a changed hypothesis"
                )
            proposal = found
        agents.validate(proposal, config)
        fp = memory.fingerprint(ref.name, proposal.experiment, proposal.parameters, gpu_kind)
        with self.stores.memory_session() as msession:
            repeat = memory.check_repeat(msession, fp)
            repeat_id = repeat.verdict.id if repeat else None
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.experiment, cycle.parameters = proposal.experiment, proposal.parameters
            cycle.hypothesis, cycle.fingerprint = proposal.hypothesis, fp
            cycle.proposal, cycle.agent_tokens = proposal.to_json(), proposal.tokens
            cycle.repeat_of = repeat_id
            if repeat_id and not changed:
                # Lesson 5: no repeat without a changed hypothesis.
                repository.set_state(
                    session,
                    cycle,
                    "skipped_repeat",
                    error=f"already judged: finding {repeat_id}; state changed_hypothesis to rerun",
                )
            else:
                repository.set_state(session, cycle, "preparing")
        return True

    def _agent(self, cycle_id: int, name: str, config: ProjectConfig) -> agents.Agent:
        if name != "command":
            return agents.for_name(name)
        cycle, ref = self.detached(cycle_id)
        forge = forge_service.forge_for(self.settings, self.stores)
        git = self.git()
        branch = self.branch(cycle, ref, forge)
        space = Workspace(self.settings.state_dir.absolute() / "cycles" / str(cycle_id) / "agent")
        return _CheckedCommandAgent(
            agents.CommandAgent(
                argv=list(config.agent.command),
                workspace=space,
                time_limit_s=config.agent.time_limit_s,
                run_name=f"agent-{cycle_id}",
                sandboxed=self.settings.sandbox == "on",
                preset=config.agent.preset,
                max_turns=config.agent.max_turns,
                env_passthrough=list(config.agent.env_passthrough),
                env_allowed=list(self.settings.agent_env_passthrough),
            ),
            git,
            branch,
            (self.settings.git_author_name, self.settings.git_author_email),
        )


@dataclass
class _CheckedCommandAgent:
    """The command agent in a fresh scratch clone of the base, then its commits taken back as
    objects and checked (protected paths, git internals, bytecode, symlinks): before any GPU."""

    inner: agents.CommandAgent
    git_work: GitWork
    branch: CycleBranch
    author: tuple[str, str]
    name: str = "command"

    def propose(self, context: agents.Context) -> agents.Proposal | None:
        space = self.inner.workspace
        space.reset()
        self.git_work.reset_to_base(self.branch)
        self.git_work.scratch_clone(self.branch, space.repo)
        proposal = self.inner.propose(context)
        bundle = workspace.pack(
            space,
            self.branch.base_sha,
            name=f"{self.inner.run_name}-pack",
            author=self.author,
            message=f"Change proposed by the agent\n\n{proposal.hypothesis if proposal else ''}",
            enabled=self.inner.sandboxed,
        )
        self.git_work.take_agent_work(self.branch, bundle)
        return proposal
