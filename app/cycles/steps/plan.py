"""planned → preparing: choose what to run, refuse a repeat (docs/design.md, "No repeat without a
changed hypothesis") and defer a cycle over budget, all before any git or GPU work.

What the cycle runs is proposed by one of four strategies (`Proposer`), chosen from the cycle:
the trigger's request (`Requested`), the cycle's agent (`ByAgent`), or its campaign's
(`CampaignStep`: the step's agent at the line's tip; `CampaignRun`: a confirmation or final
measurement, run again as recorded). `Plan` runs what every cycle shares around it.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from app.agents import service as agents
from app.agents import workspace
from app.agents.exceptions import NothingToPropose
from app.agents.llm import LLMAgent
from app.agents.workspace import Workspace
from app.clock import utcnow
from app.cycles import agent_context, repository, service
from app.cycles.campaigns import context as campaign_context
from app.cycles.campaigns.context import FIXED_ROLES
from app.cycles.exceptions import Transient
from app.cycles.steps.base import Step
from app.forge import service as forge_service
from app.forge.base import Forge, ProjectRef
from app.git.exceptions import FetchFailed
from app.git.refs import CycleBranch
from app.git.work import GitWork
from app.jobs import budgets
from app.memory import service as memory
from app.projects.config import ProjectConfig
from app.projects.models import Project
from app.sandbox import cgroups


@dataclass(frozen=True)
class Planned:
    """What planning reads of a `planned` cycle and its project, in one short session."""

    cycle_id: int
    project: Project
    ref: ProjectRef
    gpu_kind: str
    experiment: str | None
    parameters: dict[str, Any] | None
    agent: str
    changed: str | None
    campaign_id: int | None
    role: str | None
    #: A campaign's cycle records its line's tip here when it is made.
    base_sha: str | None
    #: A campaign's confirmation or final measurement: its step's hypothesis.
    hypothesis: str | None


class Plan(Step):
    FROM_STATES = ("planned",)
    TO_STATES = ("preparing", "skipped_repeat", "deferred_budget")

    def run(self, cycle_id: int) -> bool:
        cycle, blocked = self._read(cycle_id)
        if blocked:
            return self._defer(cycle_id, blocked)
        proposer = proposer_for(self, cycle)
        forge = forge_service.forge_for(self.settings, self.stores)
        try:
            base_sha, config = proposer.base(forge)
        except FetchFailed as exc:
            raise Transient(exc.detail) from exc
        over = self._over_token_budget(cycle_id, config) if proposer.token_budgeted else None
        if over:
            return self._defer(cycle_id, over)
        kind = config.agent.kind if cycle.agent == "config" else cycle.agent
        lock = proposer.lock(kind)
        ran = False
        try:
            with contextlib.ExitStack() as held:
                if lock is not None:
                    name, wait = lock
                    if not held.enter_context(self._plan_lock(name, wait=wait)):
                        return False
                ran = True
                proposal = proposer.propose(config, base_sha, kind)
                agents.validate(proposal, config)
                self._record(cycle, proposal, base_sha, repeat_checked=proposer.repeat_checked)
        finally:
            proposer.done(ran)
        return True

    def _read(self, cycle_id: int) -> tuple[Planned, str | None]:
        """The cycle as planning reads it, and why the project's job budget holds it (or None)."""
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            project = service.project_of(session, cycle)
            planned = Planned(
                cycle_id=cycle_id,
                project=project,
                ref=ProjectRef.of(project),
                gpu_kind=project.gpu_kind,
                experiment=cycle.experiment,
                parameters=cycle.parameters,
                agent=cycle.agent,
                changed=cycle.changed_hypothesis,
                campaign_id=cycle.campaign_id,
                role=cycle.role,
                base_sha=cycle.base_sha,
                hypothesis=cycle.hypothesis,
            )
            blocked = budgets.blocked_by_budget(session, self.settings, project)
        return planned, blocked

    def _defer(self, cycle_id: int, why: str) -> bool:
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            repository.set_state(session, cycle, "deferred_budget", error=why)
        return True

    def _record(
        self, planned: Planned, proposal: agents.Proposal, base_sha: str, *, repeat_checked: bool
    ) -> None:
        """The proposal on the cycle, which moves on to `preparing`, or to `skipped_repeat` when
        memory already judged it and no changed hypothesis is stated."""
        fp = memory.fingerprint(
            planned.ref.name,
            proposal.experiment,
            proposal.parameters,
            planned.gpu_kind,
            proposal.change_id,
        )
        repeat_id = None
        if repeat_checked:
            with self.stores.memory_session() as msession:
                repeat = memory.check_repeat(msession, fp)
                repeat_id = repeat.verdict.id if repeat else None
        with self.stores.ops_session() as session:
            cycle = service.get(session, planned.cycle_id)
            cycle.experiment, cycle.parameters = proposal.experiment, proposal.parameters
            cycle.hypothesis, cycle.fingerprint = proposal.hypothesis, fp
            cycle.proposal, cycle.agent_tokens = proposal.to_json(), proposal.tokens
            cycle.agent_exchange = proposal.exchange
            cycle.repeat_of = repeat_id
            if repeat_id and not planned.changed:
                # No repeat without a changed hypothesis: memory already judged this.
                repository.set_state(
                    session,
                    cycle,
                    "skipped_repeat",
                    error=(
                        f"already judged: finding {repeat_id}; state changed_hypothesis to rerun"
                    ),
                )
            else:
                # The commit the config was read at and the agent worked on: the cycle's
                # base from here on (prepare makes its branch there without a fetch).
                cycle.base_sha = base_sha
                repository.set_state(session, cycle, "preparing")

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


def proposer_for(plan: Plan, cycle: Planned) -> Proposer:
    """Who proposes what `cycle` runs. A campaign's step is made without an experiment
    (`campaigns.members.new_cycle`): its agent proposes one."""
    if cycle.role in FIXED_ROLES:
        return CampaignRun(plan, cycle)
    if cycle.campaign_id is not None:
        return CampaignStep(plan, cycle, cycle.campaign_id)
    if cycle.experiment:
        return Requested(plan, cycle)
    return ByAgent(plan, cycle)


class Proposer:
    """How a cycle's proposal is made. By default: at the project's base branch, under no lock,
    held by the token budget and refused as a repeat."""

    #: Whether the project's LLM token budget holds the cycle.
    token_budgeted = True
    #: Whether memory's repeat check applies.
    repeat_checked = True

    def __init__(self, plan: Plan, cycle: Planned) -> None:
        self.plan, self.cycle = plan, cycle

    def base(self, forge: Forge) -> tuple[str, ProjectConfig]:
        """The commit the cycle starts at, and the project's config there."""
        return forge_service.config_at_base(self.plan.git(), forge, self.cycle.ref)

    def lock(self, kind: str) -> tuple[str, bool] | None:
        """The plan lock held while it proposes and records (its name, and whether to wait for
        it or leave the cycle `planned`), or None for no lock."""
        return None

    def propose(self, config: ProjectConfig, base_sha: str, kind: str) -> agents.Proposal:
        raise NotImplementedError

    def done(self, ran: bool) -> None:
        """After planning: `ran` when it got its lock (it planned, or failed to)."""


def _at_line_tip(plan: Plan, cycle: Planned) -> tuple[str, ProjectConfig] | None:
    """A campaign's cycle starts at its line's tip, recorded when it was made; its confirmation
    and final measurement run a commit already made (docs/design.md, "Research lines")."""
    if cycle.campaign_id is None or cycle.base_sha is None:
        return None
    config = forge_service.config_at_commit(
        plan.git(), cycle.ref.name, cycle.base_sha, cycle.ref.default_branch
    )
    return cycle.base_sha, config


class Requested(Proposer):
    """The trigger's experiment and parameters, checked against the config."""

    def propose(self, config: ProjectConfig, base_sha: str, kind: str) -> agents.Proposal:
        name, changed = str(self.cycle.experiment), self.cycle.changed
        params = config.experiment(name).check_parameters(dict(self.cycle.parameters or {}))
        return agents.Proposal(
            hypothesis=changed or f"{name} at {params} on {self.cycle.gpu_kind}",
            experiment=name,
            parameters=params,
            changes=changed or "",
        )


class CampaignRun(Proposer):
    """A campaign's confirmation or final measurement: its candidate run again at the line's tip,
    with the experiment and parameters recorded. No agent runs, so no token budget holds it;
    a confirmation repeats its step on purpose (fresh blocks and seed): no repeat check."""

    token_budgeted = False
    repeat_checked = False

    def base(self, forge: Forge) -> tuple[str, ProjectConfig]:
        return _at_line_tip(self.plan, self.cycle) or super().base(forge)

    def propose(self, config: ProjectConfig, base_sha: str, kind: str) -> agents.Proposal:
        name = str(self.cycle.experiment)
        experiment = config.experiment(name)
        return agents.Proposal(
            hypothesis=self.cycle.hypothesis or f"{name} on {self.cycle.gpu_kind}",
            experiment=name,
            parameters=experiment.check_parameters(dict(self.cycle.parameters or {})),
            changes="a campaign's candidate, run again: no agent",
        )


class ByAgent(Proposer):
    """The cycle's agent (the config's, or the one the trigger named) proposes at the base.

    Two sweeps of one project planned at once would see the same live points and pick the same
    one, a repeat: a sweep chooses and records its point under the project's lock, for the
    milliseconds that takes. An agent that works for minutes is not serialised."""

    def lock(self, kind: str) -> tuple[str, bool] | None:
        return (self.cycle.ref.name, True) if kind == "sweep" else None

    def context(self, config: ProjectConfig) -> agents.Context:
        return agent_context.build_context(
            self.plan.stores, self.cycle.project, config, self.cycle.cycle_id
        )

    def propose(self, config: ProjectConfig, base_sha: str, kind: str) -> agents.Proposal:
        context = self.context(config)
        agent = self._agent(kind, config, base_sha)
        try:
            found = agent.propose(context)
        except Exception:
            self._keep_exchange(agent)  # why it failed, for the reviewer
            raise
        if found is None:
            raise NothingToPropose(
                "every point of the declared parameter space has a recorded verdict "
                "or a live cycle; declare new points or state a changed hypothesis"
            )
        return found

    def _keep_exchange(self, agent: agents.Agent) -> None:
        inner = getattr(agent, "inner", agent)
        exchange, tokens = getattr(inner, "exchange", None), getattr(inner, "tokens", None)
        if not exchange and tokens is None:
            return
        with self.plan.stores.ops_session() as session:
            cycle = service.get(session, self.cycle.cycle_id)
            cycle.agent_exchange = exchange or None
            cycle.agent_tokens = tokens

    def _agent(self, name: str, config: ProjectConfig, base_sha: str) -> agents.Agent:
        if name not in ("command", "llm"):
            return agents.for_name(name)
        plan, cycle_id = self.plan, self.cycle.cycle_id
        cycle, ref = plan.detached(cycle_id)
        cycle.base_sha = base_sha  # detached: the agent's branch starts where the config was read
        forge = forge_service.forge_for(plan.settings, plan.stores)
        git = plan.git()
        branch = plan.branch(cycle, ref, forge)
        space = Workspace(plan.settings.state_dir.absolute() / "cycles" / str(cycle_id) / "agent")
        author = (plan.settings.git_author_name, plan.settings.git_author_email)
        hidden = tuple(config.project.hidden)
        run_name = cgroups.of_deployment(f"agent-{cycle_id}", plan.settings.state_dir)
        if name == "llm":
            model = LLMAgent.from_settings(plan.settings, config.agent, space, run_name)
            return _CheckedCommandAgent(model, git, branch, author, "llm", hidden)
        return _CheckedCommandAgent(
            agents.CommandAgent(
                argv=list(config.agent.command),
                workspace=space,
                time_limit_s=config.agent.time_limit_s,
                run_name=run_name,
                sandboxed=plan.settings.sandbox == "on",
                preset=config.agent.preset,
                max_turns=config.agent.max_turns,
                env_passthrough=list(config.agent.env_passthrough),
                env_allowed=list(plan.settings.agent_env_passthrough),
            ),
            git,
            branch,
            author,
            hidden=hidden,
        )


class CampaignStep(ByAgent):
    """A campaign's step (docs/design.md, "Research lines"): its agent proposes at the line's
    tip, told the line so far and what the round's other steps test, and the step runs at the
    experiment's defaults (the line's code alone differs).

    The round's steps plan one after another, each told what the steps planned before it test,
    so that they differ. A step that finds another planning waits (in `planned`, rung again when
    that one is done, planned or failed) rather than hold a control thread for the agent's
    minutes."""

    def __init__(self, plan: Plan, cycle: Planned, campaign_id: int) -> None:
        super().__init__(plan, cycle)
        self.campaign_id = campaign_id

    def base(self, forge: Forge) -> tuple[str, ProjectConfig]:
        return _at_line_tip(self.plan, self.cycle) or super().base(forge)

    def lock(self, kind: str) -> tuple[str, bool] | None:
        return f"campaign-{self.campaign_id}", False

    def context(self, config: ProjectConfig) -> agents.Context:
        context = super().context(config)
        campaign_context.add_line(self.plan.stores, context, self.campaign_id, self.cycle.cycle_id)
        return context

    def propose(self, config: ProjectConfig, base_sha: str, kind: str) -> agents.Proposal:
        return campaign_context.at_defaults(super().propose(config, base_sha, kind), config)

    def done(self, ran: bool) -> None:
        if ran:  # the round's next step may plan now
            campaign_context.ring_waiting(
                self.plan.stores, self.plan.settings, self.campaign_id, self.cycle.cycle_id
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
