"""A person's part of a cycle: the reviewer's decision on its pull request, and the merge of an
approved one, re-validated first when the base branch moved. Both own their short sessions, as
the machine does: the forge and the re-validation job run outside any transaction."""

from __future__ import annotations

import time
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
from app.settings import Settings


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
    if number is not None:
        forge = forge_service.forge_for(settings, stores)
        verb = "Approved" if approve else "Rejected"
        forge.comment(ref, number, f"{verb} by {actor}." + (f"\n\n{note}" if note else ""))
        if not approve:
            forge.close(ref, number)
    decision = "approved" if approve else "rejected"
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
                detail=f"{decision} by {actor}: {note}"[:2000],
            ),
        )
    if approve and merge:
        broker.ring_merge(settings, cycle_id)
    return cycle


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
