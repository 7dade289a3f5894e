"""A person's part of a cycle: the reviewer's decision on its pull request, and the merge of an
approved one, re-validated first when the base branch moved. Both own their short sessions, as
the machine does: the forge and the re-validation job run outside any transaction."""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from typing import Any

from app import broker
from app.clock import utcnow
from app.cycles import repository, service
from app.cycles.exceptions import NotAwaitingReview, Unjudgeable
from app.cycles.headline import headline, ratio_text
from app.cycles.judge import judge
from app.cycles.machine import Machine
from app.cycles.models import Cycle, CycleStep
from app.db import Stores
from app.errors import InvalidInput
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git.work import GitWork
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED
from app.memory import service as memory
from app.projects import service as projects
from app.redaction import redact_text
from app.settings import Settings


@contextlib.contextmanager
def _deciding(settings: Settings, cycle_id: int) -> Iterator[None]:
    """One decision on a cycle at a time on this control host. A rejection closes the PR on
    GitHub before it records the state, and GitHub's webhook for that close may come back in
    between: it waits here, then finds the cycle decided. (Several control hosts would use a
    PostgreSQL advisory lock, as the machine's lock would.)"""
    folder = settings.state_dir.absolute() / "cycles"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"review-{cycle_id}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def review(
    stores: Stores,
    settings: Settings,
    cycle_id: int,
    *,
    approve: bool,
    note: str,
    actor: str,
    merge: bool = False,
    on_forge: bool = False,
) -> Cycle:
    """A reviewer's decision: approve validates the cycle's proposed findings, reject refutes
    them with the note; both post the note on the pull request. Merging (optional on approve)
    happens afterwards on the control queue, re-validating first if the base moved.

    `on_forge`: the decision was taken on the forge itself (the PR merged or closed on
    GitHub), so it is only recorded: nothing is posted, closed or merged there again. A cycle
    decided already raises NotAwaitingReview (or IllegalMove, when two deciders raced)."""
    note = note.strip()
    if not approve and not note:
        raise InvalidInput("a rejection needs a note saying why (it becomes the refutation)")
    with _deciding(settings, cycle_id):
        cycle = _decide(stores, settings, cycle_id, approve, note, actor, on_forge)
    if approve and merge and not on_forge:
        broker.ring_merge(settings, cycle_id)
    return cycle


def _decide(
    stores: Stores,
    settings: Settings,
    cycle_id: int,
    approve: bool,
    note: str,
    actor: str,
    on_forge: bool,
) -> Cycle:
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        if cycle.state != "awaiting_review":
            raise NotAwaitingReview(
                f"cycle {cycle_id} is {cycle.state}; only a cycle awaiting review can be decided"
            )
        ref = ProjectRef.of(service.project_of(session, cycle))
        number, finding_ids = cycle.pr_number, cycle.finding_ids
    with stores.memory_session() as msession:
        for finding_id in finding_ids or []:
            finding = memory.get(msession, finding_id)
            if finding.status != "proposed":
                continue  # decided before a crash: not twice
            if approve:
                memory.validate(msession, finding_id, actor, reason=note or None)
            else:
                memory.refute(msession, finding_id, actor, reason=note)
    if number is not None and not on_forge:
        forge = forge_service.forge_for(settings, stores)
        verb = "Approved" if approve else "Rejected"
        forge.comment(ref, number, f"{verb} by {actor}." + (f"\n\n{note}" if note else ""))
        if not approve:
            forge.close(ref, number)
    decision = "approved" if approve else "rejected"
    where = " on the forge" if on_forge else ""
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        repository.set_state(session, cycle, decision)
        repository.add_step(
            session,
            CycleStep(
                cycle_id=cycle_id,
                name="review",
                status="done",
                finished_at=utcnow(),
                detail=f"{decision} by {actor}{where}: {note}"[:2000],
            ),
        )
    return cycle


def record_forge_review(
    stores: Stores, cycle_id: int, state: str, actor: str, note: str
) -> CycleStep:
    """A review submitted on the forge (approved, changes requested) shown on the cycle as a
    step of its audit trail; it decides nothing: a merge, a close or a command does."""
    with stores.ops_session() as session:
        service.get(session, cycle_id)
        return repository.add_step(
            session,
            CycleStep(
                cycle_id=cycle_id,
                name=FORGE_REVIEW_STEP,
                status="done",
                finished_at=utcnow(),
                detail=redact_text(f"{state} by {actor}" + (f": {note}" if note else ""))[:2000],
            ),
            detached=True,
        )


#: The step that shows a review submitted on the forge.
FORGE_REVIEW_STEP = "forge_review"


def rerun(stores: Stores, settings: Settings, cycle_id: int, actor: str, key: str) -> int:
    """A new cycle at the same experiment and point as `cycle_id`, with the stated change
    "re-run asked by <actor>" (memory holds a verdict there already). `key` makes it
    idempotent: asked again with the same key, the first new cycle is returned."""
    with stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        project = service.project_of(session, cycle)
        if cycle.experiment is None:
            raise InvalidInput(f"cycle {cycle_id} proposed no experiment; nothing to re-run")
        trigger = service.Trigger(
            project=project.name,
            experiment=cycle.experiment,
            parameters=dict(cycle.parameters or {}),
            changed_hypothesis=f"re-run of cycle {cycle_id}, asked by {actor}",
            idempotency_key=service.idempotency(actor, key, {"rerun": cycle_id})[0],
            trigger="forge",
        )
        new, created = service.create(
            session, trigger, max_live=settings.max_live_cycles_per_project
        )
        new_id = new.id
    if created:  # after the commit
        broker.ring_advance(settings, new_id)
    return new_id


def cycle_of_pull_request(stores: Stores, project_ids: list[int], number: int) -> int | None:
    """The id of the cycle whose pull request is `number` in one of the projects, or None."""
    with stores.ops_session() as session:
        cycle = repository.by_pull_request(session, project_ids, number)
        return cycle.id if cycle is not None else None


def awaiting_on_forge(stores: Stores) -> list[tuple[int, int, ProjectRef]]:
    """(cycle id, pull request number, project) of every cycle awaiting review on a PR."""
    with stores.ops_session() as session:
        rows = repository.awaiting_review_with_pr(session)
        projects_by_id = {
            p: ProjectRef.of(projects.get_project_by_id(session, p)) for _, p, _ in rows
        }
        return [(c, n, projects_by_id[p]) for c, p, n in rows]


def merge_approved(machine: Machine, cycle_id: int) -> str:
    """Merge an approved cycle's PR, re-running its experiment first if the base moved."""
    forge = forge_service.forge_for(machine.settings, machine.stores)
    with machine.stores.ops_session() as session:
        cycle = service.get(session, cycle_id)
        ref = ProjectRef.of(service.project_of(session, cycle))
        number, base_sha, verdict = cycle.pr_number, cycle.base_sha, cycle.verdict
        experiment, parameters = str(cycle.experiment), dict(cycle.parameters or {})
        head = cycle.branch
    if cycle.state != "approved" or number is None or base_sha is None or head is None:
        return cycle.state
    git_work = GitWork(machine.settings)

    def revalidate(pr: Any, new_base: str) -> tuple[bool, str]:
        url = forge.remote_url(ref)
        merge = git_work.merge_commit(ref.name, url, head, new_base)
        branch = f"{head}-revalidate-{new_base[:12]}"
        config = forge_service.config_at_commit(git_work, ref.name, merge, branch)
        merged = git_work.push_commit(ref.name, merge, url, branch)
        source = jobs.JobSource(
            repo=forge.fetch_url(ref), ref=branch, head_sha=merged, base_sha=new_base
        )
        with machine.stores.ops_session() as session:
            row = projects.get_project(session, ref.name)
            job = jobs.submit(
                session, machine.settings, row, config, experiment, parameters, source=source
            )
            job_id, queue = job.id, job.queue
        broker.ring_gpu(machine.settings, queue)
        deadline = time.monotonic() + config.experiment(experiment).longest_job_s + 600
        while time.monotonic() < deadline:
            with machine.stores.ops_session() as session:
                job = jobs.get(session, job_id)
                state, raw, spec = job.state, dict(job.result or {}), dict(job.spec or {})
            if state in FINISHED:
                break
            time.sleep(1.0)  # waiting on another process's job: poll the DB, bounded
        else:
            return False, f"re-validation job {job_id} did not finish in time"
        if state != "succeeded":
            return False, f"re-validation job {job_id} {state}"
        if raw.get("status") != "ok":
            return False, f"re-validation job {job_id} produced no result"
        try:
            result = judge(raw, spec)  # as Analyze judges it: never the job's own verdict
        except Unjudgeable as exc:
            return False, f"re-validation job {job_id}: the result cannot be judged: {exc.detail}"
        new_verdict = str(result["verdict"])
        if new_verdict != verdict:
            return False, f"verdict changed from {verdict} to {new_verdict} (job {job_id})"
        return True, f"verdict {verdict} holds (job {job_id}, {ratio_text(headline(result))})"

    outcome = forge_service.merge_with_revalidation(
        forge, git_work, ref, number, run_base_sha=base_sha, revalidate=revalidate
    )
    with machine.stores.ops_session() as session:
        repository.add_step(
            session,
            CycleStep(
                cycle_id=cycle_id,
                name="merge",
                status="done" if outcome.merged else "failed",
                finished_at=utcnow(),
                detail=outcome.reason[:2000],
            ),
        )
    return "merged" if outcome.merged else "not merged"
