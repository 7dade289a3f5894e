"""All SQL of cycles and their steps. Repositories only flush; the caller owns the transaction."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Select, Table, bindparam, func, insert, inspect, select, update
from sqlalchemy.orm import Session, make_transient_to_detached

from app.clock import utcnow
from app.cycles import lifecycle
from app.cycles.models import Cycle, CycleStep
from app.cycles.states import HOLDS_FINGERPRINT, LIVE, ON_JOB, STEPPING
from app.projects.models import Project

# -- cycles -------------------------------------------------------------------------------------


def get(session: Session, cycle_id: int) -> Cycle | None:
    return session.get(Cycle, cycle_id)


def by_idempotency_key(session: Session, key: str) -> Cycle | None:
    """The cycle an earlier trigger with the same key created, if any."""
    return session.scalars(select(Cycle).where(Cycle.idempotency_key == key)).one_or_none()


def add(session: Session, cycle: Cycle) -> None:
    session.add(cycle)
    session.flush()


_INSERT = insert(Cycle.__table__)  # type: ignore[arg-type]
_COLUMNS = [c.key for c in Cycle.__table__.columns if c.key != "id"]
#: The columns' scalar defaults (state `planned`, agent, trigger, gpu_seconds), applied here as
#: the ORM would at its INSERT, so the object says what the row holds.
_DEFAULTS = {
    c.key: c.default.arg
    for c in Cycle.__table__.columns
    if c.default is not None and c.default.is_scalar
}


def insert_new(session: Session, cycle: Cycle) -> Cycle:
    """Store a new cycle with one Core INSERT in the session's transaction, bypassing the
    unit of work (the trigger route's insert without an Idempotency-Key: the ORM flush cost
    three times the rest of the route's database work). `cycle` gets its id and
    defaults, and joins the session as the row it now is (persistent: a later change to it is
    flushed as an UPDATE). Not for a savepoint that may roll back: the object would stay in
    the session without its row."""
    now = utcnow()
    values = {key: getattr(cycle, key) for key in _COLUMNS}  # an unset attribute reads None
    values.update({k: v for k, v in _DEFAULTS.items() if values[k] is None})
    values["created_at"], values["updated_at"] = now, now
    # A None is left out (the column is NULL); given, a JSON column would store JSON `null`.
    # Both read back as None. A handful of shapes, each compiled once.
    key = (
        session.connection()
        .execute(_INSERT, {k: v for k, v in values.items() if v is not None})
        .inserted_primary_key
    )
    assert key is not None  # an INSERT of one row always has it
    cycle.id = int(key[0])
    for name, value in values.items():  # every column known: reading one loads nothing
        setattr(cycle, name, value)
    make_transient_to_detached(cycle)
    session.add(cycle)
    return cycle


def detach(session: Session, cycle: Cycle) -> None:
    """For reading the row after its session closed (around git, forge, subprocess work)."""
    session.expunge(cycle)


def set_state(session: Session, cycle: Cycle, state: str, error: str | None = None) -> None:
    """Move the cycle to `state` (`lifecycle.move`: an illegal move raises IllegalMove)."""
    lifecycle.move(cycle, state, error=error)
    session.flush()


# Built once: the trigger route runs it on every request, and building the statement (the
# `IN` over LIVE, the subquery) cost more CPU than executing it from the compiled cache.
_PROJECT_AND_LIVE_COUNT = select(
    Project.id,
    select(func.count())
    .select_from(Cycle)
    .where(Cycle.project_id == Project.id, Cycle.state.in_(LIVE))
    .scalar_subquery(),
).where(Project.name == bindparam("project_name"))


def project_and_live_count(session: Session, project_name: str) -> tuple[int, int] | None:
    """The named project's id and how many of its cycles have not finished stepping, in one
    query (a trigger's only read), or None when no project has that name."""
    # Core execution on the session's connection: no ORM entity is loaded, so the ORM's
    # statement handling would only add CPU. It does not autoflush: flushed here, so a change
    # pending in this session (a cycle just cancelled) is counted as the ORM query would.
    session.flush()
    row = (
        session.connection()
        .execute(_PROJECT_AND_LIVE_COUNT, {"project_name": project_name})
        .first()
    )
    return None if row is None else (int(row[0]), int(row[1] or 0))


def list_cycles(
    session: Session,
    *,
    project_id: int | None = None,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Sequence[Cycle]:
    query = _filtered(select(Cycle), project_id, state)
    return session.scalars(query.order_by(Cycle.id.desc()).limit(limit).offset(offset)).all()


def count_cycles(
    session: Session, *, project_id: int | None = None, state: str | None = None
) -> int:
    query = _filtered(select(func.count()).select_from(Cycle), project_id, state)
    return session.scalar(query) or 0


def _filtered(query: Select[Any], project_id: int | None, state: str | None) -> Select[Any]:
    if project_id is not None:
        query = query.where(Cycle.project_id == project_id)
    if state:
        query = query.where(Cycle.state == state)
    return query


def tokens_since(session: Session, project_id: int, since: datetime) -> int:
    """The agent tokens of the project's cycles touched since `since` (an upper bound of what
    its agents spent in that time: tokens are spent when a cycle is planned)."""
    total = session.scalar(
        select(func.coalesce(func.sum(Cycle.agent_tokens), 0)).where(
            # updated since: a cycle planned later than it was created (resumed after a budget
            # deferral) is counted too; one touched later than its planning is counted anyway,
            # which errs on the side of the budget
            Cycle.project_id == project_id,
            Cycle.updated_at >= since,
        )
    )
    return int(total or 0)


def stepping_untouched_since(session: Session, older_than: datetime) -> list[tuple[int, datetime]]:
    """Cycles with a step to run that nobody has moved since `older_than`: (id, updated_at)."""
    rows = session.execute(
        select(Cycle.id, Cycle.updated_at).where(
            Cycle.state.in_(STEPPING), Cycle.updated_at < older_than
        )
    ).all()
    return [(cycle_id, updated_at) for cycle_id, updated_at in rows]


def waiting_on_job_ids(session: Session) -> list[int]:
    """Cycles whose next move is their job's end."""
    return list(session.scalars(select(Cycle.id).where(Cycle.state.in_(ON_JOB))).all())


_CYCLE = Cycle.__table__.c
# A row per cycle awaiting review, so thousands a plan while reviewers catch up: Core execution
# on the session's connection, a third cheaper a row than the ORM's (bench/plan_history.py).
_LIVE_FINGERPRINTS = select(_CYCLE.fingerprint).where(
    _CYCLE.project_id == bindparam("project_id"),
    _CYCLE.id != bindparam("exclude"),
    _CYCLE.state.in_(HOLDS_FINGERPRINT),
    _CYCLE.fingerprint.is_not(None),
)


def live_fingerprints(session: Session, project_id: int, exclude: int) -> set[str]:
    """Fingerprints the project's other unfinished (or unreviewed) cycles already hold."""
    session.flush()  # as the ORM's autoflush would: a change pending here is counted
    rows = session.connection().execute(
        _LIVE_FINGERPRINTS, {"project_id": project_id, "exclude": exclude}
    )
    return {fp for fp in rows.scalars() if fp}


def deferred(session: Session) -> Sequence[Cycle]:
    """Every cycle deferred for budget."""
    return session.scalars(select(Cycle).where(Cycle.state == "deferred_budget")).all()


def oldest_deferred_locked(session: Session, project_id: int, limit: int) -> Sequence[Cycle]:
    """The project's oldest `limit` cycles deferred for budget, locked for this transaction.

    Two jobs ending at once resume two cycles, not the same one twice (SKIP LOCKED on
    PostgreSQL; SQLite serialises its writers anyway)."""
    return session.scalars(
        select(Cycle)
        .where(Cycle.project_id == project_id, Cycle.state == "deferred_budget")
        .order_by(Cycle.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def counts_by_state(session: Session) -> dict[str, int] | None:
    """Cycle counts by state, or None when the ops DB has no `cycle` table (yet)."""
    if not inspect(session.connection()).has_table("cycle"):
        return None
    rows = session.execute(select(Cycle.state, func.count()).group_by(Cycle.state))
    return {str(state): int(count) for state, count in rows}


def by_pull_request(session: Session, project_ids: Sequence[int], number: int) -> Cycle | None:
    """The cycle whose pull request is `number` in one of the projects (those that share one
    repository share its numbers): the newest, if several."""
    if not project_ids:
        return None
    return session.scalars(
        select(Cycle)
        .where(Cycle.project_id.in_(project_ids), Cycle.pr_number == number)
        .order_by(Cycle.id.desc())
        .limit(1)
    ).first()


def awaiting_review_with_pr(session: Session) -> list[tuple[int, int, int]]:
    """(cycle id, project id, pull request number) of every cycle awaiting review on a PR."""
    rows = session.execute(
        select(Cycle.id, Cycle.project_id, Cycle.pr_number)
        .where(Cycle.state == "awaiting_review", Cycle.pr_number.is_not(None))
        .order_by(Cycle.id)
    ).all()
    return [(int(c), int(p), int(n)) for c, p, n in rows if n is not None]


# -- steps --------------------------------------------------------------------------------------


def steps(session: Session, cycle_id: int) -> Sequence[CycleStep]:
    """The cycle's audit trail, oldest first."""
    return session.scalars(
        select(CycleStep).where(CycleStep.cycle_id == cycle_id).order_by(CycleStep.id)
    ).all()


def campaign_of(session: Session, cycle_id: int) -> int | None:
    """The campaign the cycle is a part of, if any."""
    return session.scalars(select(Cycle.campaign_id).where(Cycle.id == cycle_id)).first()


def state_of(session: Session, cycle_id: int) -> str | None:
    """The cycle's state alone (one column, no object: the machine reads it before each step);
    None for no such cycle (an id past the 32-bit column names none: PostgreSQL would raise)."""
    if not 1 <= cycle_id <= 2**31 - 1:
        return None
    return session.execute(_STATE, {"cycle_id": cycle_id}).scalar_one_or_none()


def begin_step(session: Session, cycle_id: int, name: str) -> CycleStep:
    """The attempt at step `name` that begins now, as a value (not in the session): a waiting
    attempt re-checked is the same attempt, started again; else a new one numbered after the
    earlier ones. Core statements, as `end_step`: the machine begins every step of every
    cycle."""
    rows = session.execute(_ATTEMPTS, {"cycle_id": cycle_id, "name": name}).all()
    waiting = next((row for row in rows if row.status == "waiting"), None)
    if waiting is not None:
        session.execute(_RESTART_STEP, {"step_id": waiting.id})
        return CycleStep(
            id=waiting.id, cycle_id=cycle_id, name=name, attempt=waiting.attempt, status="started"
        )
    step = CycleStep(
        cycle_id=cycle_id, name=name, attempt=len(rows) + 1, status="started", started_at=utcnow()
    )
    values = {c: getattr(step, c) for c in ("cycle_id", "name", "attempt", "status", "started_at")}
    key = session.connection().execute(_INSERT_STEP, values).inserted_primary_key
    assert key is not None  # an INSERT of one row always has it
    step.id = int(key[0])
    return step


def end_step(session: Session, step_id: int, status: str, detail: str | None) -> None:
    """Record how a started attempt ended, in one UPDATE (no read first: the machine ends every
    step of every cycle). A `waiting` attempt has not finished."""
    statement = _END_STEP[lifecycle.ATTEMPT.check(f"cycle step {step_id}", "started", status)]
    finished = utcnow() if status != "waiting" else None
    session.execute(statement, {"step_id": step_id, "detail": detail, "finished": finished})


_STEPS: Table = CycleStep.__table__  # type: ignore[assignment]
_STATE = select(Cycle.__table__.c.state).where(Cycle.__table__.c.id == bindparam("cycle_id"))
_ATTEMPTS = select(_STEPS.c.id, _STEPS.c.attempt, _STEPS.c.status).where(
    _STEPS.c.cycle_id == bindparam("cycle_id"), _STEPS.c.name == bindparam("name")
)
_INSERT_STEP = insert(_STEPS)
# An attempt's moves, checked against its lifecycle: one UPDATE each, from the status it has.
_RESTART = lifecycle.ATTEMPT.guarded("waiting", "started")
_RESTART_STEP = (
    update(_STEPS)
    .where(_STEPS.c.id == bindparam("step_id"), _STEPS.c.status.in_(_RESTART.frm))
    .values(**_RESTART.assign)
)
_END_STEP = {
    end.to: update(_STEPS)
    .where(_STEPS.c.id == bindparam("step_id"), _STEPS.c.status.in_(end.frm))
    .values(**end.assign, detail=bindparam("detail"), finished_at=bindparam("finished"))
    for end in (lifecycle.ATTEMPT.guarded("started", to) for to in lifecycle.ATTEMPT_ENDS)
}


def add_step(session: Session, step: CycleStep, *, detached: bool = False) -> CycleStep:
    """Record a step row; `detached` hands it back readable after the session closes."""
    session.add(step)
    session.flush()
    if detached:
        session.expunge(step)
    return step


# -- read by the dashboard ----


def change_marks(session: Session) -> list[tuple[object, ...]]:
    """The cycles' and steps' counts and latest times: they move whenever either does."""
    return [
        tuple(session.execute(select(func.count(Cycle.id), func.max(Cycle.updated_at))).one()),
        tuple(
            session.execute(select(func.count(CycleStep.id), func.max(CycleStep.finished_at))).one()
        ),
    ]
