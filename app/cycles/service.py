"""The cycle state machine. `advance(cycle)` is idempotent: each step looks up what is already
done (a step row per attempt; commits, pushes, PRs and findings looked up before redone) and
continues, so it can be called again after any crash.

planned → preparing → queued → running → analyzing → committing → publishing → awaiting_review
→ approved | rejected; other ends: skipped_repeat, deferred_budget, failed, cancelled.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app import broker
from app.agents import service as agents
from app.clock import aware, utcnow
from app.cycles import repository as cycle_repository
from app.cycles.headline import headline, ratio_text, verdict_statement
from app.cycles.models import Cycle, CycleStep
from app.db import Stores
from app.errors import AutopilotError, Conflict, InvalidInput, NotFound, Unavailable
from app.forge import report
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.forge.git import GitWork, slugify
from app.jobs import service as jobs
from app.jobs.models import FINISHED, Job
from app.memory import service as memory
from app.memory.exceptions import FindingExists
from app.memory.schemas import Evidence, FindingCreate
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.models import Project
from app.settings import Settings, redact_text

log = logging.getLogger(__name__)

TERMINAL = ("approved", "rejected", "skipped_repeat", "failed", "cancelled")
WAITING = ("awaiting_review", "deferred_budget")
# Where a follower (the CLI, the demo) stops watching: an end, or a wait on a person or budget.
SETTLED = (*TERMINAL, *WAITING)
LIVE = ("planned", "preparing", "queued", "running", "analyzing", "committing", "publishing")
MAX_STEP_ATTEMPTS = 5


class CycleNotFound(NotFound):
    slug = "cycle-not-found"
    title = "Cycle not found"


class TooManyCycles(AutopilotError):
    status = 429
    slug = "too-many-cycles"
    title = "Too many unfinished cycles"


class CycleFinished(Conflict):
    slug = "cycle-finished"
    title = "Cycle already ended"


# -- triggers --------------------------------------------------------------------------------


@dataclass
class Trigger:
    project: str
    agent: str | None = None
    experiment: str | None = None
    parameters: dict[str, Any] | None = None
    changed_hypothesis: str | None = None
    idempotency_key: str | None = None
    trigger: str = "api"


def create(session: Session, trigger: Trigger, max_live: int | None = None) -> tuple[Cycle, bool]:
    """A new planned cycle, or the one an earlier request with the same key created.

    A flood of triggers is refused (429) once a project has `max_live` unfinished cycles: the
    queue and both budgets stay bounded, and nothing is left half-made."""
    if trigger.idempotency_key:
        existing = session.scalars(
            select(Cycle).where(Cycle.idempotency_key == trigger.idempotency_key)
        ).one_or_none()
        if existing is not None:
            return existing, False
    project = ops.get_project(session, trigger.project)
    if max_live is not None:
        live = (
            session.scalar(
                select(func.count())
                .select_from(Cycle)
                .where(Cycle.project_id == project.id, Cycle.state.in_(LIVE))
            )
            or 0
        )
        if live >= max_live:
            raise TooManyCycles(
                f"project {project.name!r} has {live} unfinished cycles (limit {max_live}, "
                "AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT); retry when some have finished"
            )
    if trigger.parameters and not trigger.experiment:
        raise InvalidInput("parameters were given without the experiment they belong to")
    if trigger.agent is not None and trigger.agent not in agents.AGENTS:
        raise InvalidInput(
            f"unknown agent {trigger.agent!r}; available: {', '.join(agents.AGENTS)} "
            "(or omit it to use the project's autopilot.toml)"
        )
    cycle = Cycle(
        project_id=project.id,
        state="planned",
        agent=trigger.agent or "config",  # "config": whatever autopilot.toml names
        trigger=trigger.trigger,
        idempotency_key=trigger.idempotency_key,
        experiment=trigger.experiment,
        parameters=trigger.parameters,
        changed_hypothesis=trigger.changed_hypothesis,
    )
    session.add(cycle)
    session.flush()
    return cycle, True


def stale(session: Session, settings: Settings, now: datetime) -> list[int]:
    """Cycles whose doorbell may have been lost: a step to run, nothing heard since; or a cycle
    still waiting for a job that ended (the job's "advance" doorbell was lost, e.g. rung while
    the broker was down or dropped by a Redis restart). Each is due again at growing intervals
    (`jobs.doorbell_due`), so a backlog of cycles is not rung again on every reaper tick."""
    older_than = now - timedelta(seconds=settings.doorbell_stale_s)
    stepping = session.execute(
        select(Cycle.id, Cycle.updated_at).where(
            Cycle.state.in_(("planned", "preparing", "analyzing", "committing", "publishing")),
            Cycle.updated_at < older_than,
        )
    ).all()
    job_ended = session.execute(
        select(Cycle.id, Job.finished_at)
        .join(Job, Job.id == Cycle.job_id)
        .where(
            Cycle.state.in_(("queued", "running")),
            Job.state.in_(FINISHED),
            Job.finished_at < older_than,
        )
    ).all()
    due = set()
    for cycle_id, since in (*stepping, *job_ended):
        waited = (now - (aware(since) or now)).total_seconds()
        if jobs.doorbell_due(waited, settings):
            due.add(cycle_id)
    return sorted(due)


def get(session: Session, cycle_id: int) -> Cycle:
    # Ids are 32-bit columns: a larger one names no cycle (PostgreSQL would raise instead).
    cycle = session.get(Cycle, cycle_id) if 1 <= cycle_id <= 2**31 - 1 else None
    if cycle is None:
        raise CycleNotFound(f"no cycle {cycle_id}; list cycles with GET /api/v1/cycles")
    return cycle


def steps(session: Session, cycle_id: int) -> Sequence[CycleStep]:
    return session.scalars(
        select(CycleStep).where(CycleStep.cycle_id == cycle_id).order_by(CycleStep.id)
    ).all()


def list_cycles(
    session: Session, *, project: str | None = None, state: str | None = None, limit: int = 100
) -> Sequence[Cycle]:
    query = select(Cycle)
    if project:
        query = query.where(Cycle.project_id == ops.get_project(session, project).id)
    if state:
        query = query.where(Cycle.state == state)
    return session.scalars(query.order_by(Cycle.id.desc()).limit(limit)).all()


def cancel(session: Session, cycle_id: int, by: str) -> Cycle:
    cycle = get(session, cycle_id)
    if cycle.state in TERMINAL:
        raise CycleFinished(f"cycle {cycle_id} already ended as {cycle.state}")
    if cycle.job_id is not None:
        job = session.get(Job, cycle.job_id)
        if job is not None and job.state not in FINISHED:
            jobs.cancel(session, job.id, by)
    _set_state(session, cycle, "cancelled", error=f"cancelled by {by}")
    return cycle


# -- the state machine ------------------------------------------------------------------------


class Transient(Exception):
    """A step failed for a reason that may pass (a push, the forge, the broker): retry later."""


@dataclass
class Machine:
    stores: Stores
    settings: Settings

    def advance(self, cycle_id: int) -> str:
        """Run steps until the cycle waits (for its job, a review, a budget) or ends."""
        with self._lock(cycle_id):
            while True:
                with self.stores.ops_session() as session:
                    cycle = get(session, cycle_id)
                    state = cycle.state
                step = STEPS.get(state)
                if step is None:
                    return state
                attempt = self._begin(cycle_id, state)
                try:
                    moved = step(self, cycle_id)
                except Transient as exc:
                    self._end(cycle_id, attempt, "retry", str(exc))
                    if attempt.attempt >= MAX_STEP_ATTEMPTS:
                        self._fail(
                            cycle_id, f"{state}: gave up after {attempt.attempt} tries: {exc}"
                        )
                        continue
                    broker.ring_advance(self.settings, cycle_id, countdown=2**attempt.attempt)
                    return state
                except AutopilotError as exc:
                    self._end(cycle_id, attempt, "failed", exc.detail)
                    self._fail(cycle_id, f"{state}: {exc.detail}")
                    continue
                except Exception as exc:  # a bug or a missing piece: fail it, never hang
                    log.exception("cycle %s: step %s crashed", cycle_id, state)
                    detail = f"{type(exc).__name__}: {exc}"
                    self._end(cycle_id, attempt, "failed", detail)
                    self._fail(cycle_id, f"{state}: unexpected error: {detail}")
                    continue
                self._end(cycle_id, attempt, "done" if moved else "waiting", None)
                if moved and self.settings.fault_exit_after_step == state:
                    os._exit(137)  # a crash at the worst moment, for the reliability tests
                if not moved:
                    return state

    @contextlib.contextmanager
    def _lock(self, cycle_id: int) -> Iterator[None]:
        # One advancer per cycle at a time on this control host; duplicates wait, then find
        # the work done. (Several control hosts would use a PostgreSQL advisory lock.)
        folder = self.settings.state_dir.absolute() / "cycles"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{cycle_id}.lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _begin(self, cycle_id: int, name: str) -> CycleStep:
        with self.stores.ops_session() as session:
            previous = session.scalars(
                select(CycleStep).where(CycleStep.cycle_id == cycle_id, CycleStep.name == name)
            ).all()
            waiting = next((s for s in previous if s.status == "waiting"), None)
            if waiting is not None:  # a wait re-checked is the same attempt, not a new one
                waiting.status = "started"
                return waiting
            row = CycleStep(cycle_id=cycle_id, name=name, attempt=len(previous) + 1)
            session.add(row)
            session.flush()
            session.expunge(row)
            return row

    def _end(self, cycle_id: int, step: CycleStep, status: str, detail: str | None) -> None:
        with self.stores.ops_session() as session:
            row = session.get(CycleStep, step.id)
            if row is not None:
                row.status, row.detail = status, redact_text(detail) if detail else None
                row.finished_at = utcnow() if status != "waiting" else None

    def _fail(self, cycle_id: int, message: str) -> None:
        with self.stores.ops_session() as session:
            _set_state(session, get(session, cycle_id), "failed", error=redact_text(message))

    # Each step returns True when it moved the cycle on, False when it has to wait.

    def plan(self, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            project = session.get(Project, cycle.project_id)
            assert project is not None
            ref = ProjectRef.of(project)
            gpu_kind, requested = project.gpu_kind, (cycle.experiment, cycle.parameters)
            agent_name, changed = cycle.agent, cycle.changed_hypothesis
            live = _live_fingerprints(session, project.id, exclude=cycle_id)
            blocked = jobs.blocked_by_budget(session, self.settings, project)
        if blocked:
            with self.stores.ops_session() as session:
                _set_state(session, get(session, cycle_id), "deferred_budget", error=blocked)
            return True
        config = project_config.load_from_repo(ref.repo_url, ref.default_branch)
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
            cycle = get(session, cycle_id)
            cycle.experiment, cycle.parameters = proposal.experiment, proposal.parameters
            cycle.hypothesis, cycle.fingerprint = proposal.hypothesis, fp
            cycle.proposal, cycle.agent_tokens = proposal.to_json(), proposal.tokens
            if repeat_id and not changed:
                # Lesson 5: no repeat without a changed hypothesis.
                cycle.repeat_of = repeat_id
                _set_state(
                    session,
                    cycle,
                    "skipped_repeat",
                    error=f"already judged: finding {repeat_id}; state changed_hypothesis to rerun",
                )
            else:
                cycle.repeat_of = repeat_id
                _set_state(session, cycle, "preparing")
        return True

    def _agent(self, cycle_id: int, name: str, config: Any) -> agents.Agent:
        if name != "command":
            return agents.for_name(name)
        cycle, ref = self._detached(cycle_id)
        forge = forge_service.forge_for(self.settings, self.stores)
        worktree = self._worktree(cycle, ref, forge)
        return _CheckedCommandAgent(
            agents.CommandAgent(
                argv=list(config.agent.command),
                workdir=worktree.path,
                files=self.settings.state_dir.absolute() / "cycles" / str(cycle_id) / "agent",
                time_limit_s=config.agent.time_limit_s,
            ),
            self._git(),
            worktree,
        )

    def _detached(self, cycle_id: int) -> tuple[Cycle, ProjectRef]:
        """The cycle (detached, for reading outside any transaction) and its project."""
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            project = session.get(Project, cycle.project_id)
            assert project is not None
            session.expunge(cycle)
            return cycle, ProjectRef.of(project)

    def _git(self) -> GitWork:
        return GitWork(self.settings)

    def _worktree(self, cycle: Cycle, project: ProjectRef, forge: Any) -> Any:
        slug = slugify(cycle.agent if cycle.agent != "config" else "cycle")
        return self._git().prepare_worktree(
            project.name, forge.remote_url(project), project.default_branch, cycle.id, slug
        )

    def prepare(self, cycle_id: int) -> bool:
        """Worktree and branch, then the job: all before any GPU is asked for."""
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref = self._detached(cycle_id)
        try:
            worktree = self._worktree(cycle, ref, forge)
        except (Unavailable, OSError) as exc:
            raise Transient(str(exc)) from exc
        config = project_config.load(worktree.path)
        ring: int | None = None
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            project = session.get(Project, cycle.project_id)
            assert project is not None
            cycle.worktree, cycle.branch = str(worktree.path), worktree.branch
            cycle.base_sha = worktree.base_sha
            if cycle.job_id is None:
                job = jobs.submit(
                    session,
                    self.settings,
                    project,
                    config,
                    str(cycle.experiment),
                    dict(cycle.parameters or {}),
                    cycle_id=cycle.id,
                )
                job.workdir = str(worktree.path)
                cycle.job_id = ring = job.id
            _set_state(session, cycle, "queued")
        if ring is not None:
            broker.ring_prepare(self.settings, ring)  # after the commit
        return True

    def wait_for_job(self, cycle_id: int) -> bool:
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            job = session.get(Job, cycle.job_id) if cycle.job_id else None
            if job is None:
                _set_state(session, cycle, "failed", error="the cycle's job is missing")
                return True
            if job.state in ("leased", "running"):
                if cycle.state != "running":
                    _set_state(session, cycle, "running")
                return False
            if job.state == "queued":
                return False
            cycle.gpu_seconds = job.gpu_seconds
            if job.state == "succeeded":
                _set_state(session, cycle, "analyzing")
            elif job.state == "cancelled":
                _set_state(session, cycle, "cancelled", error="its job was cancelled")
            else:
                _set_state(session, cycle, "failed", error=f"job {job.id} failed: {job.error}")
            # Its GPU is free again: the project's oldest cycle deferred for budget may go now,
            # rather than at the next schedule tick (a peak budget frees with every job).
            resumed = resume_deferred(session, self.settings, cycle.project_id, limit=1)
        for other in resumed:
            broker.ring_advance(self.settings, other)
        return True

    def analyze(self, cycle_id: int) -> bool:
        """Lesson 4: the harness's verdict decides, accuracy gate first."""
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            job = session.get(Job, cycle.job_id) if cycle.job_id else None
            result = (job.result if job else None) or {}
            if result.get("status") != "ok":
                _set_state(session, cycle, "failed", error="the experiment produced no result")
                return True
            cycle.verdict = str(result.get("verdict") or "inconclusive")
            cycle.headline = headline(result)
            _set_state(session, cycle, "committing")
        return True

    def commit(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            project = session.get(Project, cycle.project_id)
            job = session.get(Job, cycle.job_id) if cycle.job_id else None
            assert project is not None
            assert job is not None
            ref, result = ProjectRef.of(project), dict(job.result or {})
            session.expunge(cycle)
        worktree = self._worktree(cycle, ref, forge)
        context = report_context(cycle, ref)
        sha = forge_service.commit_results(self._git(), worktree, result, context)
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            cycle.commit_sha = sha
            _set_state(session, cycle, "publishing")
        return True

    def publish(self, cycle_id: int) -> bool:
        forge = forge_service.forge_for(self.settings, self.stores)
        cycle, ref = self._detached(cycle_id)
        worktree = self._worktree(cycle, ref, forge)
        title = f"[autopilot] {cycle.experiment}: {cycle.verdict} ({ratio_text(cycle.headline)})"
        body = pr_body(cycle)
        try:
            pr = forge_service.publish(
                self._git(), forge, ref, worktree, str(cycle.id), title=title, body=body
            )
        except Unavailable as exc:
            raise Transient(exc.detail) from exc
        finding_ids = self._record_findings(cycle, ref, pr.url)
        with self.stores.ops_session() as session:
            cycle = get(session, cycle_id)
            cycle.pr_number, cycle.pr_url, cycle.finding_ids = pr.number, pr.url, finding_ids
            _set_state(session, cycle, "awaiting_review")
        return True

    def _record_findings(self, cycle: Cycle, project: ProjectRef, pr_url: str) -> list[str]:
        """The verdict and the agent's lessons, as *proposed*: a reviewer's approval validates."""
        with self.stores.ops_session() as session:
            device = session.get(Project, cycle.project_id)
            device_kind = device.gpu_kind if device else "cpu"
        evidence = Evidence(
            cycle_id=str(cycle.id),
            commit=cycle.commit_sha,
            pr_url=pr_url,
            result_path=f"{report.results_dir(str(cycle.id))}/result.json",
        )
        lessons = list((cycle.proposal or {}).get("proposed_lessons") or [])
        drafts = [
            FindingCreate(
                project=project.name,
                kind="verdict",
                statement=verdict_statement(cycle),
                hypothesis=cycle.hypothesis,
                fingerprint=cycle.fingerprint,
                device_kind=device_kind,
                scope={"parameters": cycle.parameters or {}},
                metrics=cycle.headline or {},
                source=pr_url,
                source_status="verified",
                evidence=evidence,
                tags=["autopilot", str(cycle.experiment)],
            ),
            *(
                FindingCreate(
                    project=project.name,
                    kind="lesson",
                    statement=text,
                    device_kind=device_kind,
                    source=pr_url,
                    source_status="verified",
                    evidence=evidence,
                )
                for text in lessons
            ),
        ]
        ids: list[str] = []
        with self.stores.memory_session() as msession:
            for draft in drafts:
                try:
                    ids.append(memory.create(msession, draft, actor=f"cycle-{cycle.id}").id)
                except FindingExists as exc:  # recorded before a crash: look it up, not again
                    ids.append(str(exc.extra.get("finding_id")))
        return ids


@dataclass
class _CheckedCommandAgent:
    """The command agent, then the protected-path check on what it changed: before any GPU."""

    inner: agents.CommandAgent
    git_work: GitWork
    worktree: Any
    name: str = "command"

    def propose(self, context: agents.Context) -> agents.Proposal | None:
        proposal = self.inner.propose(context)
        self.git_work.git.run(["add", "--all"], self.worktree.path)
        self.git_work.check_protected(self.worktree)
        return proposal


STEPS: dict[str, Callable[[Machine, int], bool]] = {
    "planned": Machine.plan,
    "preparing": Machine.prepare,
    "queued": Machine.wait_for_job,
    "running": Machine.wait_for_job,
    "analyzing": Machine.analyze,
    "committing": Machine.commit,
    "publishing": Machine.publish,
}


def _set_state(session: Session, cycle: Cycle, state: str, error: str | None = None) -> None:
    cycle.state, cycle.updated_at = state, utcnow()
    if error is not None:
        cycle.error = error
    session.flush()


def _live_fingerprints(session: Session, project_id: int, exclude: int) -> set[str]:
    rows = session.scalars(
        select(Cycle.fingerprint).where(
            Cycle.project_id == project_id,
            Cycle.id != exclude,
            Cycle.state.in_((*LIVE, "awaiting_review")),
            Cycle.fingerprint.is_not(None),
        )
    ).all()
    return {fp for fp in rows if fp}


def report_context(cycle: Cycle, project: ProjectRef) -> report.ReportContext:
    proposal = cycle.proposal or {}
    params = " ".join(f"{k}={v}" for k, v in sorted((cycle.parameters or {}).items()))
    return report.ReportContext(
        cycle_id=str(cycle.id),
        project=project.name,
        hypothesis=cycle.hypothesis or "",
        changes=cycle.changed_hypothesis or str(proposal.get("what_changed") or ""),
        method="paired, interleaved A/B runs; median ratio with a bootstrap 95% CI; A/A noise "
        "floor; accuracy gate before speed",
        lessons=list(proposal.get("proposed_lessons") or []),
        reproduce=f"autopilot job submit --project {project.name} --experiment "
        f"{cycle.experiment} " + " ".join(f"--param {p}" for p in params.split()),
        base_sha=cycle.base_sha,
    )


def pr_body(cycle: Cycle) -> str:
    return (
        f"Autopilot cycle {cycle.id}.\n\n**Hypothesis**: {cycle.hypothesis}\n\n"
        f"**Verdict**: {cycle.verdict}, {ratio_text(cycle.headline)}\n\n"
        f"The report is in `{report.results_dir(str(cycle.id))}/REPORT.md`."
    )


# -- review ------------------------------------------------------------------------------------


class NotAwaitingReview(Conflict):
    slug = "not-awaiting-review"
    title = "Cycle is not awaiting review"


def review(
    stores: Stores,
    settings: Settings,
    cycle_id: int,
    *,
    approve: bool,
    note: str,
    actor: str,
    merge: bool = False,
) -> Cycle:
    """A reviewer's decision: approve validates the cycle's proposed findings, reject refutes
    them with the note; both post the note on the pull request. Merging (optional on approve)
    happens afterwards on the control queue, re-validating first if the base moved."""
    note = note.strip()
    if not approve and not note:
        raise InvalidInput("a rejection needs a note saying why (it becomes the refutation)")
    with stores.ops_session() as session:
        cycle = get(session, cycle_id)
        if cycle.state != "awaiting_review":
            raise NotAwaitingReview(
                f"cycle {cycle_id} is {cycle.state}; only a cycle awaiting review can be decided"
            )
        project = session.get(Project, cycle.project_id)
        assert project is not None
        ref, number, finding_ids = ProjectRef.of(project), cycle.pr_number, cycle.finding_ids
    with stores.memory_session() as msession:
        for finding_id in finding_ids or []:
            finding = memory.get(msession, finding_id)
            if finding.status != "proposed":
                continue  # decided before a crash: not twice
            if approve:
                memory.validate(msession, finding_id, actor, reason=note or None)
            else:
                memory.refute(msession, finding_id, actor, reason=note)
    if number is not None:
        forge = forge_service.forge_for(settings, stores)
        verb = "Approved" if approve else "Rejected"
        forge.comment(ref, number, f"{verb} by {actor}." + (f"\n\n{note}" if note else ""))
        if not approve:
            forge.close(ref, number)
    with stores.ops_session() as session:
        cycle = get(session, cycle_id)
        _set_state(session, cycle, "approved" if approve else "rejected")
        session.add(
            CycleStep(
                cycle_id=cycle_id,
                name="review",
                status="done",
                finished_at=utcnow(),
                detail=f"{'approved' if approve else 'rejected'} by {actor}: {note}"[:2000],
            )
        )
    if approve and merge:
        broker.ring_merge(settings, cycle_id)
    return cycle


def merge_approved(machine: Machine, cycle_id: int) -> str:
    """Merge an approved cycle's PR, re-running its experiment first if the base moved."""
    forge = forge_service.forge_for(machine.settings, machine.stores)
    with machine.stores.ops_session() as session:
        cycle = get(session, cycle_id)
        project = session.get(Project, cycle.project_id)
        assert project is not None
        ref = ProjectRef.of(project)
        number, base_sha, verdict = cycle.pr_number, cycle.base_sha, cycle.verdict
        experiment, parameters = str(cycle.experiment), dict(cycle.parameters or {})
        head = cycle.branch
    if cycle.state != "approved" or number is None or base_sha is None or head is None:
        return cycle.state
    git_work = GitWork(machine.settings)

    def revalidate(pr: Any, new_base: str) -> tuple[bool, str]:
        dest = machine.settings.state_dir.absolute() / "revalidate" / f"{cycle_id}-{new_base[:12]}"
        checkout = git_work.merged_checkout(ref.name, forge.remote_url(ref), head, new_base, dest)
        config = project_config.load(checkout)
        with machine.stores.ops_session() as session:
            row = session.get(Project, ref_id(session, ref.name))
            assert row is not None
            job = jobs.submit(session, machine.settings, row, config, experiment, parameters)
            job.workdir = str(checkout)
            job_id = job.id
        broker.ring_prepare(machine.settings, job_id)
        deadline = time.monotonic() + config.experiment(experiment).time_limit_s + 600
        while time.monotonic() < deadline:
            with machine.stores.ops_session() as session:
                job = jobs.get(session, job_id)
                state, result = job.state, dict(job.result or {})
            if state in FINISHED:
                break
            time.sleep(1.0)  # waiting on another process's job: poll the DB, bounded
        else:
            return False, f"re-validation job {job_id} did not finish in time"
        if state != "succeeded":
            return False, f"re-validation job {job_id} {state}"
        new_verdict = str(result.get("verdict") or "inconclusive")  # as analyze() reads it
        if new_verdict != verdict:
            return False, f"verdict changed from {verdict} to {new_verdict} (job {job_id})"
        return True, f"verdict {verdict} holds (job {job_id}, {ratio_text(headline(result))})"

    outcome = forge_service.merge_with_revalidation(
        forge, git_work, ref, number, run_base_sha=base_sha, revalidate=revalidate
    )
    with machine.stores.ops_session() as session:
        session.add(
            CycleStep(
                cycle_id=cycle_id,
                name="merge",
                status="done" if outcome.merged else "failed",
                finished_at=utcnow(),
                detail=outcome.reason[:2000],
            )
        )
    return "merged" if outcome.merged else "not merged"


def ref_id(session: Session, name: str) -> int:
    return ops.get_project(session, name).id


# -- the schedule ------------------------------------------------------------------------------


def set_autopilot(session: Session, name: str, enabled: bool, schedule: str | None) -> Project:
    """Start or stop a project's schedule; starting needs a schedule (given or stored)."""
    from app.cycles import schedule as schedules

    project = ops.get_project(session, name)
    if schedule is not None:
        schedules.parse(schedule)
        project.schedule = schedule
    if enabled and not project.schedule:
        raise InvalidInput("schedule: give one to start the autopilot, e.g. 'every 2h'")
    project.autopilot_enabled = enabled
    session.flush()
    return project


def schedule_tick(session: Session, settings: Settings) -> list[int]:
    """Beat's tick: start the cycles that are due, and resume deferred ones whose budget
    allows again. Returns the cycles to ring (after the caller commits)."""
    from app.cycles import schedule as schedules

    now = utcnow()
    ring: list[int] = []
    projects = session.scalars(select(Project).where(Project.autopilot_enabled.is_(True))).all()
    for project in projects:
        if not project.schedule or not schedules.is_due(
            project.schedule, project.last_scheduled_at, now
        ):
            continue
        project.last_scheduled_at = now
        try:
            with session.begin_nested():
                cycle, _ = create(
                    session,
                    Trigger(project=project.name, trigger="schedule"),
                    max_live=settings.max_live_cycles_per_project,
                )
        except TooManyCycles:
            log.warning("schedule of %s skipped: too many unfinished cycles", project.name)
            continue
        ring.append(cycle.id)
    deferred = session.scalars(select(Cycle).where(Cycle.state == "deferred_budget")).all()
    for cycle in deferred:
        owner = session.get(Project, cycle.project_id)
        if owner is not None and jobs.blocked_by_budget(session, settings, owner) is None:
            _set_state(session, cycle, "planned")
            ring.append(cycle.id)
    session.flush()
    return ring


def resume_deferred(session: Session, settings: Settings, project_id: int, limit: int) -> list[int]:
    """Return up to `limit` of the project's oldest `deferred_budget` cycles to `planned`
    when its budgets allow a job now; the caller rings them after commit."""
    owner = session.get(Project, project_id)
    if owner is None or jobs.blocked_by_budget(session, settings, owner) is not None:
        return []
    waiting = session.scalars(
        select(Cycle)
        .where(Cycle.project_id == project_id, Cycle.state == "deferred_budget")
        .order_by(Cycle.id)
        .limit(limit)
        # two jobs ending at once resume two cycles, not the same one twice (PostgreSQL;
        # SQLite serialises its writers anyway)
        .with_for_update(skip_locked=True)
    ).all()
    for cycle in waiting:
        _set_state(session, cycle, "planned")
    session.flush()
    return [c.id for c in waiting]


# -- read by the dashboard ----


def change_marks(session: Session) -> list[tuple[object, ...]]:
    """What moves when any cycle or step changes (the dashboard's live pages compare it)."""
    return cycle_repository.change_marks(session)
