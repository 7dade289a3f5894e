"""The queries of campaigns and their steps (the only module of campaigns that runs SQL)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.cycles.campaigns.lifecycle import LIVE
from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.models import Cycle
from app.cycles.states import ALL, TERMINAL

_LIVE = tuple(s for s in ALL if s not in TERMINAL)


def add(session: Session, row: Campaign | CampaignStep | Cycle) -> None:
    session.add(row)
    session.flush()


def get(session: Session, campaign_id: int) -> Campaign | None:
    if not 1 <= campaign_id <= 2**31 - 1:
        return None
    return session.get(Campaign, campaign_id)


def list_campaigns(
    session: Session, *, project_id: int | None, state: str | None, limit: int, offset: int
) -> Sequence[Campaign]:
    query = select(Campaign)
    if project_id is not None:
        query = query.where(Campaign.project_id == project_id)
    if state is not None:
        query = query.where(Campaign.state == state)
    return session.scalars(query.order_by(Campaign.id.desc()).limit(limit).offset(offset)).all()


def steps(session: Session, campaign_id: int) -> Sequence[CampaignStep]:
    """The campaign's steps in the order they were started."""
    query = select(CampaignStep).where(CampaignStep.campaign_id == campaign_id)
    return session.scalars(query.order_by(CampaignStep.round, CampaignStep.cycle_id)).all()


def cycles(session: Session, ids: Sequence[int]) -> dict[int, Cycle]:
    if not ids:
        return {}
    return {c.id: c for c in session.scalars(select(Cycle).where(Cycle.id.in_(list(ids))))}


def live_untouched_since(session: Session, since: datetime) -> list[int]:
    """Live campaigns nothing moved since `since`: the reaper rings them (a lost doorbell)."""
    query = select(Campaign.id).where(Campaign.state.in_(LIVE), Campaign.updated_at < since)
    return list(session.scalars(query.order_by(Campaign.id)))


def detach(session: Session, row: Campaign) -> None:
    session.expunge(row)


def by_pull_request(session: Session, project_ids: Sequence[int], number: int) -> Campaign | None:
    query = select(Campaign).where(
        Campaign.project_id.in_(list(project_ids)), Campaign.pr_number == number
    )
    return session.scalars(query.limit(1)).first()


def undecided_with_pr(session: Session) -> list[tuple[int, int, int]]:
    """(campaign id, project id, PR number) of the ended campaigns whose line awaits review."""
    query = select(Campaign.id, Campaign.project_id, Campaign.pr_number).where(
        Campaign.pr_number.is_not(None), Campaign.decision.is_(None)
    )
    rows = session.execute(query.order_by(Campaign.id)).all()
    return [(c, p, n) for c, p, n in rows if n is not None]


def planned_steps(session: Session, campaign_id: int, *, exclude: int) -> list[int]:
    query = select(Cycle.id).where(
        Cycle.campaign_id == campaign_id,
        Cycle.role == "step",
        Cycle.state == "planned",
        Cycle.id != exclude,
    )
    return list(session.scalars(query.order_by(Cycle.id)))


def live_cycles(session: Session, campaign_id: int) -> list[int]:
    """The campaign's cycles not ended (any role)."""
    query = select(Cycle.id).where(Cycle.campaign_id == campaign_id, Cycle.state.in_(_LIVE))
    return list(session.scalars(query.order_by(Cycle.id)))
