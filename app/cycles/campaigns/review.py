"""A campaign's findings and the reviewer's decision on its line's pull request: one proposed
verdict finding per kept step and one for the cumulative result, recorded when the PR opens;
approving validates them all, rejecting refutes them with the note (as a cycle's review does)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

from app.cycles.campaigns import repository
from app.cycles.campaigns.lifecycle import ENDS
from app.cycles.campaigns.models import Campaign
from app.cycles.campaigns.service import CampaignNotEnded, get
from app.cycles.headline import verdict_statement
from app.db import Stores
from app.errors import Conflict, InvalidInput
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.memory import service as memory
from app.memory.exceptions import FindingExists
from app.memory.schemas import Evidence, FindingCreate
from app.projects import service as projects
from app.settings import Settings


class CampaignDecided(Conflict):
    slug = "campaign-decided"
    title = "Campaign already decided"


def record_findings(
    stores: Stores, campaign_id: int, project: ProjectRef, device_kind: str, pr_url: str
) -> list[str]:
    """The campaign's proposed findings (found again, not made twice, after a crash)."""
    with stores.ops_session() as session:
        campaign = get(session, campaign_id)
        kept = [s for s in repository.steps(session, campaign_id) if s.outcome == "kept"]
        cycles = repository.cycles(session, [s.cycle_id for s in kept])
        drafts = []
        for step in kept:
            cycle = cycles[step.cycle_id]
            drafts.append(
                FindingCreate(
                    project=project.name,
                    kind="verdict",
                    statement=(
                        f"{verdict_statement(cycle)}, confirmed on fresh blocks and kept on the "
                        f"line of campaign {campaign_id} as {str(step.kept_sha)[:12]}"
                    ),
                    hypothesis=cycle.hypothesis,
                    fingerprint=cycle.fingerprint,
                    device_kind=device_kind,
                    scope={
                        "parameters": cycle.parameters or {},
                        "campaign": campaign_id,
                        "on": step.tip_sha,
                    },
                    metrics=cycle.headline or {},
                    source=pr_url,
                    source_status="verified",
                    evidence=Evidence(cycle_id=str(cycle.id), commit=step.kept_sha, pr_url=pr_url),
                    tags=["autopilot", "campaign", str(cycle.experiment)],
                )
            )
        drafts.append(_cumulative(campaign, project, device_kind, pr_url, len(kept)))
    ids: list[str] = []
    with stores.memory_session() as msession:
        for draft in drafts:
            try:
                ids.append(memory.create(msession, draft, actor=f"campaign-{campaign_id}").id)
            except FindingExists as exc:
                ids.append(str(exc.extra.get("finding_id")))
    return ids


def _cumulative(
    campaign: Campaign, project: ProjectRef, device_kind: str, pr_url: str, kept: int
) -> FindingCreate:
    c = campaign.cumulative or {}
    if c.get("ratio") is not None:
        figures = (
            f"{c.get('verdict')}, ratio {c['ratio']:.4f} "
            f"[{c.get('ci_low', float('nan')):.4f}, {c.get('ci_high', float('nan')):.4f}]"
        )
    else:
        figures = f"not measured ({c.get('error') or 'no final measurement'})"
    return FindingCreate(
        project=project.name,
        kind="verdict",
        statement=(
            f"Campaign {campaign.id}: {kept} kept step(s); the line's tip "
            f"{str(campaign.tip_sha)[:12]} against its start {str(campaign.start_sha)[:12]}: "
            f"{figures} (cycle {c.get('cycle_id')})"
        ),
        hypothesis=f"the kept steps of campaign {campaign.id} together improve on its start",
        device_kind=device_kind,
        scope={"campaign": campaign.id, "start": campaign.start_sha, "tip": campaign.tip_sha},
        metrics=dict(c),
        source=pr_url,
        source_status="verified",
        evidence=Evidence(
            cycle_id=str(c.get("cycle_id")) if c.get("cycle_id") else None,
            commit=campaign.tip_sha,
            pr_url=pr_url,
        ),
        tags=["autopilot", "campaign", "cumulative"],
    )


def review(
    stores: Stores,
    settings: Settings,
    campaign_id: int,
    *,
    approve: bool,
    note: str,
    actor: str,
    on_forge: bool = False,
) -> Campaign:
    """Approve (validates the campaign's findings) or reject (refutes them with the note) the
    line's pull request; both post the note on it, a rejection closes it. `on_forge`: decided
    on the forge itself, so only recorded."""
    note = note.strip()
    if not approve and not note:
        raise InvalidInput("a rejection needs a note saying why (it becomes the refutation)")
    with _deciding(settings, campaign_id):
        with stores.ops_session() as session:
            campaign = get(session, campaign_id)
            if campaign.state not in ENDS or campaign.pr_number is None:
                raise CampaignNotEnded(
                    f"campaign {campaign_id} is {campaign.state} with no pull request yet; "
                    "its line is reviewed once it has ended with one"
                )
            if campaign.decision is not None:
                raise CampaignDecided(
                    f"campaign {campaign_id} was {campaign.decision} by {campaign.decided_by}"
                )
            ref = ProjectRef.of(projects.get_project_by_id(session, campaign.project_id))
            number, finding_ids = campaign.pr_number, list(campaign.finding_ids or [])
        with stores.memory_session() as msession:
            for finding_id in finding_ids:
                if memory.get(msession, finding_id).status != "proposed":
                    continue  # decided before a crash: not twice
                if approve:
                    memory.validate(msession, finding_id, actor, reason=note or None)
                else:
                    memory.refute(msession, finding_id, actor, reason=note)
        if not on_forge:
            forge = forge_service.forge_for(settings, stores)
            verb = "Approved" if approve else "Rejected"
            forge.comment(ref, number, f"{verb} by {actor}." + (f"\n\n{note}" if note else ""))
            if not approve:
                forge.close(ref, number)
        with stores.ops_session() as session:
            campaign = get(session, campaign_id)
            campaign.decision = "approved" if approve else "rejected"
            campaign.decided_by, campaign.decision_note = actor, note or None
            session.flush()
            repository.detach(session, campaign)
    return campaign


@contextlib.contextmanager
def _deciding(settings: Settings, campaign_id: int) -> Iterator[None]:
    folder = settings.state_dir.absolute() / "campaigns"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"review-{campaign_id}.lock", "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def campaign_of_pull_request(stores: Stores, project_ids: list[int], number: int) -> int | None:
    """The id of the campaign whose line's pull request is `number` in one of the projects."""
    with stores.ops_session() as session:
        campaign = repository.by_pull_request(session, project_ids, number)
        return campaign.id if campaign is not None else None


def awaiting_on_forge(stores: Stores) -> list[tuple[int, int, ProjectRef]]:
    """(campaign id, PR number, project) of every ended campaign whose line awaits review."""
    with stores.ops_session() as session:
        rows = repository.undecided_with_pr(session)
        refs = {p: ProjectRef.of(projects.get_project_by_id(session, p)) for _, p, _ in rows}
        return [(c, n, refs[p]) for c, p, n in rows]
