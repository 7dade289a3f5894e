"""What a campaign's step shows its agent: the line so far and what runs beside it."""

from __future__ import annotations

from app import broker
from app.agents.service import Context, Proposal
from app.cycles.campaigns import repository
from app.db import Stores
from app.errors import InvalidInput
from app.projects.config import ProjectConfig
from app.settings import Settings

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


class NoCodeChange(InvalidInput):
    """A campaign's step whose agent changed no code: a line keeps commits."""

    slug = "no-code-change"
    title = "No code change"


#: How a step's cycle that changed no code ends (its error starts so): discarded `no_change`.
NO_CHANGE = "no code change"


def at_defaults(proposal: Proposal, config: ProjectConfig) -> Proposal:
    """A step's proposal as the campaign runs it: at its experiment's defaults, so that the
    candidate and the tip differ by their code alone (a parameter the agent chose would move
    both the step's number and nothing the line keeps). A proposal with no code change is
    refused before any GPU is asked."""
    if proposal.change_id is None:
        raise NoCodeChange(
            f"{NO_CHANGE}: the agent changed no file at the line's tip; a campaign's line "
            "keeps commits, so each step must change code (parameters alone are not kept)"
        )
    experiment = config.experiment(proposal.experiment)
    proposal.parameters = experiment.check_parameters({})
    return proposal


def ring_waiting(stores: Stores, settings: Settings, campaign_id: int, cycle_id: int) -> None:
    """Ring the campaign's step cycles still `planned` (each waits for the one planning now)."""
    with stores.ops_session() as session:
        waiting = repository.planned_steps(session, campaign_id, exclude=cycle_id)
    for other in waiting:
        broker.ring_advance(settings, other)
