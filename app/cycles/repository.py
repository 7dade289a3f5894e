"""All SQL of cycles and their steps. Repositories only flush; the caller owns the transaction."""

from __future__ import annotations

from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session

from app.cycles.models import Cycle, CycleStep


def counts_by_state(session: Session) -> dict[str, int] | None:
    """Cycle counts by state, or None when the ops DB has no `cycle` table (yet)."""
    if not inspect(session.connection()).has_table("cycle"):
        return None
    rows = session.execute(select(Cycle.state, func.count()).group_by(Cycle.state))
    return {str(state): int(count) for state, count in rows}


# -- read by the dashboard ----


def change_marks(session: Session) -> list[tuple[object, ...]]:
    """The cycles' and steps' counts and latest times: they move whenever either does."""
    return [
        tuple(session.execute(select(func.count(Cycle.id), func.max(Cycle.updated_at))).one()),
        tuple(
            session.execute(select(func.count(CycleStep.id), func.max(CycleStep.finished_at))).one()
        ),
    ]
