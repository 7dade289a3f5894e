"""When a campaign starts no new round: a stop, `max_cycles`, `max_hours`, or
`stop_after_no_gain` steps in a row that were not kept (in the order they were decided)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from app.clock import aware, utcnow
from app.cycles.campaigns.models import Campaign, CampaignStep


def why_end(campaign: Campaign, steps: Sequence[CampaignStep]) -> str | None:
    """Why no new round starts (None: one does)."""
    if campaign.stop_requested:
        return campaign.end_reason or "stopped"
    if len(steps) >= campaign.max_cycles:
        return f"max_cycles reached ({campaign.max_cycles} steps)"
    if campaign.max_hours is not None:
        started = aware(campaign.created_at) or utcnow()
        if utcnow() - started >= timedelta(hours=campaign.max_hours):
            return f"max_hours reached ({campaign.max_hours:g} h)"
    if campaign.stop_after_no_gain is not None:
        decided = sorted(
            (s for s in steps if s.decided_at is not None),
            key=lambda s: (aware(s.decided_at) or utcnow(), s.cycle_id),
        )
        run = 0
        for s in reversed(decided):
            if s.outcome == "kept":
                break
            run += 1
        if run >= campaign.stop_after_no_gain:
            return f"stop_after_no_gain reached ({run} steps in a row not kept)"
    return None
