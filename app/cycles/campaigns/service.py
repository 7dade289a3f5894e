"""The public face of campaigns: start one, read them, ask one to stop. What moves a campaign
is `driver.py`; the rule that keeps a step is `app/cycles/judge/keep.py`."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from app.agents import service as agents
from app.clock import utcnow
from app.cycles.campaigns import repository
from app.cycles.campaigns.lifecycle import ENDS
from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.campaigns.schemas import CampaignCreate, CampaignOut, StepOut
from app.errors import Conflict, InvalidInput, NotFound
from app.projects import service as projects
from app.settings import Settings


class CampaignNotFound(NotFound):
    slug = "campaign-not-found"
    title = "Campaign not found"


class CampaignEnded(Conflict):
    slug = "campaign-ended"
    title = "Campaign has ended"


class CampaignNotEnded(Conflict):
    slug = "campaign-not-ended"
    title = "Campaign has not ended"


def create(session: Session, body: CampaignCreate, by: str) -> Campaign:
    """A running campaign; its driver makes its line and its first round."""
    project = projects.get_project(session, body.project)  # ProjectNotFound names it
    if body.agent is not None and body.agent not in agents.AGENTS:
        raise InvalidInput(
            f"unknown agent {body.agent!r}; available: {', '.join(agents.AGENTS)} "
            "(or omit it to use the project's autopilot.toml)"
        )
    campaign = Campaign(
        project_id=project.id,
        state="running",
        agent=body.agent,
        experiment=body.experiment,
        max_cycles=body.max_cycles,
        parallel=body.parallel,
        stop_after_no_gain=body.stop_after_no_gain,
        max_hours=body.max_hours,
        round=0,
        stop_requested=False,
        created_by=by,
    )
    repository.add(session, campaign)
    return campaign


def get(session: Session, campaign_id: int) -> Campaign:
    campaign = repository.get(session, campaign_id)
    if campaign is None:
        raise CampaignNotFound(
            f"no campaign {campaign_id}; list them with GET /api/v1/campaigns",
            campaign_id=campaign_id,
        )
    return campaign


def list_campaigns(
    session: Session,
    *,
    project: str | None = None,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> Sequence[Campaign]:
    project_id = projects.get_project(session, project).id if project is not None else None
    return repository.list_campaigns(
        session, project_id=project_id, state=state, limit=limit, offset=offset
    )


def stop(session: Session, campaign_id: int, by: str) -> Campaign:
    """Ask the campaign to end: no new step starts, its live steps are cancelled, and it ends
    `stopped` with its pull request (what was kept so far, measured against its start)."""
    campaign = get(session, campaign_id)
    if campaign.state in ENDS:
        raise CampaignEnded(f"campaign {campaign_id} has already ended ({campaign.state})")
    if not campaign.stop_requested:
        campaign.stop_requested = True
        # One finishing already keeps why it ends (a limit reached); it ends `stopped`.
        campaign.end_reason = campaign.end_reason or f"stopped by {by}"
        campaign.updated_at = utcnow()
        session.flush()
    return campaign


def stale(session: Session, settings: Settings, now: datetime) -> list[int]:
    """Live campaigns nothing moved for `doorbell_stale_s`: a doorbell may have been lost (a
    control worker killed mid-move), so the reaper rings them; the driver is idempotent."""
    return repository.live_untouched_since(
        session, now - timedelta(seconds=settings.doorbell_stale_s)
    )


def out(session: Session, campaign: Campaign) -> CampaignOut:
    """The campaign's JSON, with its steps (and each step's cycle state and hypothesis)."""
    rows = repository.steps(session, campaign.id)
    cycles = repository.cycles(session, [s.cycle_id for s in rows])
    names = projects.project_names(session)
    return CampaignOut(
        id=campaign.id,
        project=names.get(campaign.project_id, str(campaign.project_id)),
        state=campaign.state,
        agent=campaign.agent,
        experiment=campaign.experiment,
        max_cycles=campaign.max_cycles,
        parallel=campaign.parallel,
        stop_after_no_gain=campaign.stop_after_no_gain,
        max_hours=campaign.max_hours,
        line_branch=campaign.line_branch,
        start_sha=campaign.start_sha,
        tip_sha=campaign.tip_sha,
        round=campaign.round,
        stop_requested=campaign.stop_requested,
        end_reason=campaign.end_reason,
        steps=[_step(s, cycles.get(s.cycle_id)) for s in rows],
        kept=sum(1 for s in rows if s.outcome == "kept"),
        final_cycle_id=campaign.final_cycle_id,
        cumulative=campaign.cumulative,
        pr_number=campaign.pr_number,
        pr_url=campaign.pr_url,
        finding_ids=campaign.finding_ids,
        decision=campaign.decision,
        decided_by=campaign.decided_by,
        decision_note=campaign.decision_note,
        error=campaign.error,
        created_by=campaign.created_by,
        created_at=campaign.created_at,
        updated_at=campaign.updated_at,
        finished_at=campaign.finished_at,
    )


def _step(step: CampaignStep, cycle: object | None) -> StepOut:
    return StepOut(
        cycle_id=step.cycle_id,
        round=step.round,
        state=getattr(cycle, "state", None),
        hypothesis=getattr(cycle, "hypothesis", None),
        tip_sha=step.tip_sha,
        confirmation_cycle_id=step.confirmation_cycle_id,
        outcome=step.outcome,
        reason=step.reason,
        sentence=step.sentence,
        ratio=step.ratio,
        ci_low=step.ci_low,
        ci_high=step.ci_high,
        kept_sha=step.kept_sha,
    )
