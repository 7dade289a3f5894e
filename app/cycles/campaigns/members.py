"""A campaign's cycles as its driver uses them: a new one, the keep rule's reading of a judged
one, the cumulative result of its final one, and a stop's cancel of the live ones."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from app.cycles import service as cycles
from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.judge import judge, keep
from app.cycles.models import Cycle
from app.cycles.states import TERMINAL
from app.jobs import service as jobs


def new_cycle(campaign: Campaign, *, role: str, base_sha: str, **fields: object) -> Cycle:
    """A new planned cycle of the campaign, starting at `base_sha`."""
    return Cycle(
        project_id=campaign.project_id,
        state="planned",
        agent=(campaign.agent or "config") if role == "step" else "campaign",
        trigger="campaign",
        campaign_id=campaign.id,
        role=role,
        base_sha=base_sha,
        **fields,
    )


def comparison(session: Session, cycle_id: int) -> keep.Comparison:
    """The keep rule's reading of a judged cycle: the judge's verdict of its job's result."""
    job = jobs.for_cycle(session, cycle_id)
    if job is None:
        raise keep.KeepError(f"cycle {cycle_id} has no job")
    return keep.Comparison.from_judged(judge(dict(job.result or {}), dict(job.spec or {})))


def cumulative(session: Session, final: Cycle) -> dict[str, object]:
    if final.state != "judged":
        return {
            "verdict": None,
            "cycle_id": final.id,
            "error": f"the final measurement (cycle {final.id}) ended {final.state}: {final.error}",
        }
    c = comparison(session, final.id)
    return {
        "ratio": c.ratio,
        "ci_low": c.ci_low,
        "ci_high": c.ci_high,
        "verdict": c.verdict,
        "cycle_id": final.id,
        "metric_source": c.metric_source,
    }


def cancel_live(session: Session, campaign: Campaign, current: Sequence[CampaignStep]) -> bool:
    """A stop: cancel the round's step cycles still in flight (confirmations run on)."""
    moved = False
    for step in current:
        if step.outcome is not None:
            continue
        cycle = cycles.get(session, step.cycle_id)
        if cycle.state not in TERMINAL:
            cycles.cancel(session, cycle.id, f"the stop of campaign {campaign.id}")
            moved = True
    return moved
