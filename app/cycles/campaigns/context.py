"""What a campaign's step shows its agent: the line so far and what runs beside it."""

from __future__ import annotations

from app.agents.service import Context
from app.cycles.campaigns import repository
from app.db import Stores

#: A campaign's cycles that run a commit already made: no agent, no repeat check.
FIXED_ROLES = ("confirmation", "final")


def add_line(stores: Stores, context: Context, campaign_id: int, cycle_id: int) -> None:
    """Every step of the line so far (kept and discarded, with ratio, interval and why), newest
    first, and the hypotheses of the other steps of this round that have one."""
    with stores.ops_session() as session:
        campaign = repository.get(session, campaign_id)
        steps = repository.steps(session, campaign_id)
        cycles = repository.cycles(session, [s.cycle_id for s in steps])
        line = []
        beside = []
        for step in reversed(steps):
            cycle = cycles.get(step.cycle_id)
            hypothesis = cycle.hypothesis if cycle is not None else None
            if step.cycle_id == cycle_id:
                continue
            if campaign is not None and step.round == campaign.round and step.outcome is None:
                if hypothesis:
                    beside.append(hypothesis)
                continue
            line.append(
                {
                    "cycle_id": step.cycle_id,
                    "hypothesis": hypothesis,
                    "outcome": step.outcome,
                    "reason": step.reason,
                    "why": step.sentence,
                    "ratio": step.ratio,
                    "ci_low": step.ci_low,
                    "ci_high": step.ci_high,
                    "commit": step.kept_sha,
                }
            )
    context.line = line
    context.parallel_hypotheses = beside
