"""The public face of cycles: trigger one, read them, cancel one, find those whose doorbell was
lost. The step machine is `machine.py` (its steps under `steps/`), the reviewer's decision and
the merge `review.py`, the autopilot's schedule `schedules.py`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.agents import service as agents
from app.clock import aware, utcnow
from app.cycles import repository
from app.cycles.exceptions import CycleFinished, CycleNotFound, TooManyCycles
from app.cycles.models import Cycle, CycleStep
from app.cycles.states import TERMINAL
from app.errors import InvalidInput
from app.jobs import reaping
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED
from app.projects import service as projects
from app.projects.exceptions import ProjectNotFound
from app.projects.models import Project
from app.settings import Settings


class IdempotencyKeyReused(InvalidInput):
    slug = "idempotency-key-reused"
    title = "Idempotency-Key reused with another request"


@dataclass
class Trigger:
    project: str
    agent: str | None = None
    experiment: str | None = None
    parameters: dict[str, Any] | None = None
    changed_hypothesis: str | None = None
    idempotency_key: str | None = None  # already scoped to the caller (see `idempotency`)
    request_hash: str | None = None  # of the request the key came with
    trigger: str = "api"


def idempotency(token_name: str, key: str, request: Mapping[str, Any]) -> tuple[str, str]:
    """The stored forms of a caller's Idempotency-Key and of its request: hashes, so that any
    key the header allows fits the column, and two callers' equal keys never meet."""
    scoped = hashlib.sha256(f"{token_name}\n{key}".encode()).hexdigest()
    body = json.dumps(request, sort_keys=True, separators=(",", ":"), default=str)
    return scoped, hashlib.sha256(body.encode()).hexdigest()


def create(
    session: Session,
    trigger: Trigger,
    max_live: int | None = None,
    key_ttl_s: float = 24 * 3600,
) -> tuple[Cycle, bool]:
    """A new planned cycle, or the one an earlier request with the same key created (within
    `key_ttl_s`; a key reused with another request is refused, as the IETF Idempotency-Key
    draft says).

    A flood of triggers is refused (429) once a project has `max_live` unfinished cycles: the
    queue and both budgets stay bounded, and nothing is left half-made.

    The trigger route's whole unit of work, kept small because triggers come in floods: without
    a key, one read (the project and its live count together) and one insert; with one, its
    lookup first and a savepoint."""
    if trigger.idempotency_key:
        existing = repository.by_idempotency_key(session, trigger.idempotency_key)
        created = aware(existing.created_at) if existing is not None else None
        if existing is not None and created is not None:
            if (utcnow() - created).total_seconds() > key_ttl_s:
                existing.idempotency_key = None  # expired: the key is free again
                session.flush()
            elif existing.idempotency_request not in (None, trigger.request_hash):
                raise IdempotencyKeyReused(
                    f"this Idempotency-Key was first used for cycle {existing.id} with another "
                    "request body; send the same body to get that cycle, or use a new key"
                )
            else:
                return existing, False
    found = repository.project_and_live_count(session, trigger.project)
    if found is None:
        raise ProjectNotFound(
            f"no project named {trigger.project!r}; list them with GET /api/v1/projects"
        )
    project_id, live = found
    if max_live is not None and live >= max_live:
        raise TooManyCycles(
            f"project {trigger.project!r} has {live} unfinished cycles (limit {max_live}, "
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
        project_id=project_id,
        state="planned",
        agent=trigger.agent or "config",  # "config": whatever autopilot.toml names
        trigger=trigger.trigger,
        idempotency_key=trigger.idempotency_key,
        idempotency_request=trigger.request_hash,
        experiment=trigger.experiment,
        parameters=trigger.parameters,
        changed_hypothesis=trigger.changed_hypothesis,
    )
    if not trigger.idempotency_key:
        # No unique key to collide on: no savepoint, and one Core INSERT (the returned cycle
        # is in the session, as the row it is).
        return repository.insert_new(session, cycle), True
    try:
        with session.begin_nested():
            repository.add(session, cycle)
    except IntegrityError:
        # The same key in flight twice (a client retrying before its first answer): the first
        # insert won; this one answers with its cycle, or 422 if the bodies differ.
        won = repository.by_idempotency_key(session, trigger.idempotency_key)
        if won is None:
            raise
        if won.idempotency_request not in (None, trigger.request_hash):
            raise IdempotencyKeyReused(
                f"this Idempotency-Key is being used for cycle {won.id} with another request "
                "body; send the same body to get that cycle, or use a new key"
            ) from None
        return won, False
    return cycle, True


def get(session: Session, cycle_id: int) -> Cycle:
    # Ids are 32-bit columns: a larger one names no cycle (PostgreSQL would raise instead).
    cycle = repository.get(session, cycle_id) if 1 <= cycle_id <= 2**31 - 1 else None
    if cycle is None:
        raise CycleNotFound(f"no cycle {cycle_id}; list cycles with GET /api/v1/cycles")
    return cycle


def project_of(session: Session, cycle: Cycle) -> Project:
    """The cycle's project (its cycles go with it: ON DELETE CASCADE)."""
    project = projects.find_project_by_id(session, cycle.project_id)
    assert project is not None
    return project


def steps(session: Session, cycle_id: int) -> Sequence[CycleStep]:
    return repository.steps(session, cycle_id)


def list_cycles(
    session: Session,
    *,
    project: str | None = None,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[Sequence[Cycle], int]:
    """A page of cycles, newest first, and how many match in all."""
    project_id = projects.get_project(session, project).id if project else None
    rows = repository.list_cycles(
        session, project_id=project_id, state=state, limit=limit, offset=offset
    )
    return rows, repository.count_cycles(session, project_id=project_id, state=state)


def cancel(session: Session, cycle_id: int, by: str) -> Cycle:
    cycle = get(session, cycle_id)
    if cycle.state in TERMINAL:
        raise CycleFinished(f"cycle {cycle_id} already ended as {cycle.state}")
    job = jobs.for_cycle(session, cycle.id)
    if job is not None and job.state not in FINISHED:
        jobs.cancel(session, job.id, by)
    repository.set_state(session, cycle, "cancelled", error=f"cancelled by {by}")
    return cycle


def stale(session: Session, settings: Settings, now: datetime) -> list[int]:
    """Cycles whose doorbell may have been lost: a step to run, nothing heard since; or a cycle
    still waiting for a job that ended (the job's "advance" doorbell was lost, e.g. rung while
    the broker was down or dropped by a Redis restart). Each is due again at growing intervals
    (`reaping.doorbell_due`), so a backlog of cycles is not rung again on every reaper tick."""
    older_than = now - timedelta(seconds=settings.doorbell_stale_s)
    stepping = repository.stepping_untouched_since(session, older_than)
    job_ended = jobs.cycles_whose_job_ended(
        session, repository.waiting_on_job_ids(session), older_than
    )
    due = set()
    for cycle_id, since in (*stepping, *job_ended):
        waited = (now - (aware(since) or now)).total_seconds()
        if reaping.doorbell_due(waited, settings):
            due.add(cycle_id)
    return sorted(due)


# -- figures: what the dashboard, /metrics and `autopilot status` read ---------------------


def counts_by_state(session: Session) -> dict[str, int] | None:
    """Cycle counts by state, or None while the ops DB has no cycle table."""
    return repository.counts_by_state(session)


def change_marks(session: Session) -> list[tuple[object, ...]]:
    """What moves when any cycle or step changes (the dashboard's live pages compare it)."""
    return repository.change_marks(session)
