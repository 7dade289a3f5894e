"""REST routes of campaigns: start, list, show, stop (docs/design.md, "Research lines")."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status

from app import broker
from app.api.deps import (
    AnyToken,
    OpsSession,
    ReviewToken,
    RowId,
    TriggerToken,
    get_settings,
    get_stores,
)
from app.cycles.campaigns import review, service
from app.cycles.campaigns.schemas import (
    CampaignCreate,
    CampaignOut,
    CampaignReview,
    CampaignState,
)
from app.db import Stores
from app.settings import Settings

router = APIRouter(prefix="/campaigns", tags=["campaigns"])


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=CampaignOut)
def start_campaign(
    body: CampaignCreate,
    token: TriggerToken,
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> CampaignOut:
    """Start a campaign: its line is made at the project's base and its first round of steps
    starts at once; `GET /api/v1/campaigns/{id}` follows it."""
    with stores.ops_session() as session:
        campaign_id = service.create(session, body, token.name).id
    broker.ring_campaign(settings, campaign_id)  # after the commit
    with stores.ops_session() as session:
        return service.out(session, service.get(session, campaign_id))


@router.get("", response_model=list[CampaignOut])
def list_campaigns(
    session: OpsSession,
    _: AnyToken,
    project: str | None = None,
    state: CampaignState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> list[CampaignOut]:
    """Campaigns, newest first."""
    rows = service.list_campaigns(session, project=project, state=state, limit=limit, offset=offset)
    return [service.out(session, c) for c in rows]


@router.get("/{campaign_id}", response_model=CampaignOut)
def get_campaign(campaign_id: RowId, session: OpsSession, _: AnyToken) -> CampaignOut:
    return service.out(session, service.get(session, campaign_id))


@router.post("/{campaign_id}/stop", response_model=CampaignOut)
def stop_campaign(
    campaign_id: RowId,
    token: TriggerToken,
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> CampaignOut:
    """Stop starting steps; the live ones are cancelled, and the campaign ends `stopped` with
    its pull request of what was kept."""
    with stores.ops_session() as session:
        service.stop(session, campaign_id, token.name)
    broker.ring_campaign(settings, campaign_id)
    with stores.ops_session() as session:
        return service.out(session, service.get(session, campaign_id))


@router.post("/{campaign_id}/review", response_model=CampaignOut)
def review_campaign(
    campaign_id: RowId,
    body: CampaignReview,
    token: ReviewToken,
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> CampaignOut:
    """Approve the line's pull request (validates each kept step's finding and the cumulative
    one) or reject it (refutes them with the note, and closes it)."""
    review.review(
        stores,
        settings,
        campaign_id,
        approve=body.decision == "approve",
        note=body.note,
        actor=token.name,
    )
    with stores.ops_session() as session:
        return service.out(session, service.get(session, campaign_id))
