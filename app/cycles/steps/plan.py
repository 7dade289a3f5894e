"""planned → preparing: choose what to run (the trigger's request, or the agent's proposal),
refuse a repeat (docs/design.md, "No repeat without a changed hypothesis") and defer a cycle
over budget, all before any git or GPU work."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from app.agents import service as agents
from app.agents import workspace
from app.agents.llm import LLMAgent
from app.agents.workspace import Workspace
from app.clock import utcnow
from app.cycles import agent_context, repository, service
from app.cycles.campaigns import context as campaign_context
from app.cycles.campaigns.context import FIXED_ROLES
from app.cycles.exceptions import Transient
from app.cycles.steps.base import Step
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git.exceptions import FetchFailed
from app.git.refs import CycleBranch
from app.git.work import GitWork
from app.jobs import budgets
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
            # A campaign's cycle starts at its line's tip (recorded when it was made); its
            # confirmation and final measurement run a commit already made (docs/design.md,
            # "Research lines").
            campaign_id, line_tip = cycle.campaign_id, cycle.base_sha
            fixed = cycle.role in FIXED_ROLES
            preset = cycle.hypothesis
            blocked = budgets.blocked_by_budget(session, self.settings, project)
        if blocked:
            with self.stores.ops_session() as session:
                cycle = service.get(session, cycle_id)
                repository.set_state(session, cycle, "deferred_budget", error=blocked)
            return True
        forge = forge_service.forge_for(self.settings, self.stores)
        try:
            if campaign_id is not None and line_tip is not None:
                base_sha = line_tip
                config = forge_service.config_at_commit(
                    self.git(), ref.name, base_sha, ref.default_branch
                )
            else:
                base_sha, config = forge_service.config_at_base(self.git(), forge, ref)
        except FetchFailed as exc:
            raise Transient(exc.detail) from exc
        # A confirmation or final measurement runs no agent: no token budget holds it.
        over = None if fixed else self._over_token_budget(cycle_id, config)
        if over:
            with self.stores.ops_session() as session:
                cycle = service.get(session, cycle_id)
                repository.set_state(session, cycle, "deferred_budget", error=over)
            return True
        kind = config.agent.kind if agent_name == "config" else agent_name
        # Two sweeps of one project planned at once would see the same live points and pick the
        # same one, a repeat: a sweep chooses and records its point under the project's lock,
        # for the milliseconds that takes. An agent that works for minutes is not serialised.
        # So do the steps of one campaign's round: each agent is told what the steps planned
        # before it test, so that they differ (docs/design.md, "Research lines").
        # A step that finds another planning waits (in `planned`, rung again when that one is
        # done) rather than hold a control thread for the agent's minutes.
        serialise = kind == "sweep" and not requested[0]
        lock, step = ref.name, campaign_id is not None and not fixed
        if step:
            serialise, lock = True, f"campaign-{campaign_id}"
        acquired = False
        try:
            with contextlib.ExitStack() as held:
                if serialise and not held.enter_context(self._plan_lock(lock, wait=not step)):
                    return False
                acquired = True
                if fixed:
                    experiment = config.experiment(str(requested[0]))
                    proposal = agents.Proposal(
                        hypothesis=preset or f"{requested[0]} on {gpu_kind}",
                        experiment=str(requested[0]),
                        parameters=experiment.check_parameters(dict(requested[1] or {})),
                        changes="a campaign's candidate, run again: no agent",
                    )
                elif requested[0]:
                    experiment = config.experiment(requested[0])
                    params = experiment.check_parameters(dict(requested[1] or {}))
                    proposal = agents.Proposal(
                        hypothesis=changed or f"{requested[0]} at {params} on {gpu_kind}",
                        experiment=requested[0],
                        parameters=params,
                        changes=changed or "",
                    )
                else:
                    context = agent_context.build_context(self.stores, project, config, cycle_id)
                    if campaign_id is not None:
                        campaign_context.add_line(self.stores, context, campaign_id, cycle_id)
                    agent = self._agent(cycle_id, kind, config, base_sha)
                    try:
                        found = agent.propose(context)
                    except Exception:
                        self._keep_exchange(cycle_id, agent)  # why it failed, for the reviewer
                        raise
                    if found is None:
                        raise agents.NothingToPropose(
                            "every point of the declared parameter space has a recorded verdict "
                            "or a live cycle; declare new points or state a changed hypothesis"
                        )
                    proposal = found
                    if step:  # the line's code alone differs: the step is judged at the defaults
                        proposal = campaign_context.at_defaults(proposal, config)
                agents.validate(proposal, config)
                fp = memory.fingerprint(
                    ref.name, proposal.experiment, proposal.parameters, gpu_kind, proposal.change_id
                )
                repeat_id = None
                if not fixed:  # a confirmation repeats its step on purpose: fresh blocks and seed
                    with self.stores.memory_session() as msession:
                        repeat = memory.check_repeat(msession, fp)
                        repeat_id = repeat.verdict.id if repeat else None
                with self.stores.ops_session() as session:
                    cycle = service.get(session, cycle_id)
                    cycle.experiment, cycle.parameters = proposal.experiment, proposal.parameters
                    cycle.hypothesis, cycle.fingerprint = proposal.hypothesis, fp
                    cycle.proposal, cycle.agent_tokens = proposal.to_json(), proposal.tokens
                    cycle.agent_exchange = proposal.exchange
                    cycle.repeat_of = repeat_id
                    if repeat_id and not changed:
                        # No repeat without a changed hypothesis: memory already judged this.
                        repository.set_state(
                            session,
                            cycle,
                            "skipped_repeat",
                            error=(
                                f"already judged: finding {repeat_id}; "
                                "state changed_hypothesis to rerun"
                            ),
                        )
                    else:
                        # The commit the config was read at and the agent worked on: the cycle's
                        # base from here on (prepare makes its branch there without a fetch).
                        cycle.base_sha = base_sha
                        repository.set_state(session, cycle, "preparing")
        finally:
            if acquired and step and campaign_id is not None:
                # the round's next step may plan now (this one planned, or failed to)
                campaign_context.ring_waiting(self.stores, self.settings, campaign_id, cycle_id)
        return True

    @contextlib.contextmanager
    def _plan_lock(self, name: str, *, wait: bool = True) -> Iterator[bool]:
        # On this control host, like Machine's cycle lock (several control hosts would use a
        # PostgreSQL advisory lock). `name`: a project's, or `campaign-<id>`. Yields whether it
        # is held (`wait=False`: False at once when another holds it).
        folder = self.settings.state_dir.absolute() / "cycles"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"plan-{name}.lock", "a+b") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def _over_token_budget(self, cycle_id: int, config: ProjectConfig) -> str | None:
        """Why the cycle must wait for the project's LLM token budget, or None."""
        budget = config.budgets.llm_tokens_per_day
        if budget is None:
            return None
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            used = repository.tokens_since(session, cycle.project_id, utcnow() - timedelta(days=1))
        if used < budget:
            return None
        return (
            f"the project's agents used {used} LLM tokens in the last 24 h; its budget "
            f"([budgets] llm_tokens_per_day) is {budget}"
        )

    def _keep_exchange(self, cycle_id: int, agent: agents.Agent) -> None:
        inner = getattr(agent, "inner", agent)
        exchange, tokens = getattr(inner, "exchange", None), getattr(inner, "tokens", None)
        if not exchange and tokens is None:
            return
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            cycle.agent_exchange = exchange or None
            cycle.agent_tokens = tokens

    def _agent(
        self, cycle_id: int, name: str, config: ProjectConfig, base_sha: str
    ) -> agents.Agent:
        if name not in ("command", "llm"):
            return agents.for_name(name)
        cycle, ref = self.detached(cycle_id)
        cycle.base_sha = base_sha  # detached: the agent's branch starts where the config was read
        forge = forge_service.forge_for(self.settings, self.stores)
        git = self.git()
        branch = self.branch(cycle, ref, forge)
        space = Workspace(self.settings.state_dir.absolute() / "cycles" / str(cycle_id) / "agent")
        author = (self.settings.git_author_name, self.settings.git_author_email)
        hidden = tuple(config.project.hidden)
        if name == "llm":
            model = LLMAgent.from_settings(self.settings, config.agent, space, f"agent-{cycle_id}")
            return _CheckedCommandAgent(model, git, branch, author, "llm", hidden)
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
            author,
            hidden=hidden,
        )


class _WorkspaceAgent(Protocol):
    """An agent that works in a scratch clone: the command agent, the LLM agent (its diff)."""

    @property
    def workspace(self) -> Workspace | None: ...
    @property
    def run_name(self) -> str: ...
    @property
    def sandboxed(self) -> bool: ...

    def propose(self, context: agents.Context) -> agents.Proposal | None: ...


@dataclass
class _CheckedCommandAgent:
    """An agent in a fresh scratch clone of the base, then its commits (and what it left
    uncommitted) taken back as objects and checked (protected paths, git internals, bytecode,
    symlinks): before any GPU."""

    inner: _WorkspaceAgent
    git_work: GitWork
    branch: CycleBranch
    author: tuple[str, str]
    name: str = "command"
    #: The project's hidden paths at the base: absent from the agent's clone and its history.
    hidden: tuple[str, ...] = ()

    def propose(self, context: agents.Context) -> agents.Proposal | None:
        space = self.inner.workspace
        assert space is not None
        space.reset()
        self.git_work.reset_to_base(self.branch)
        start = self.git_work.scratch_clone(self.branch, space.repo, self.hidden)
        proposal = self.inner.propose(context)
        bundle = workspace.pack(
            space,
            start,
            name=f"{self.inner.run_name}-pack",
            author=self.author,
            message=f"Change proposed by the agent\n\n{proposal.hypothesis if proposal else ''}",
            enabled=self.inner.sandboxed,
        )
        head = self.git_work.take_agent_work(self.branch, bundle, self.hidden)
        if proposal is not None:
            proposal.change_id = self.git_work.change_id(self.branch, head)
        return proposal
