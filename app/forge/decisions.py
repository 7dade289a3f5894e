"""Decisions taken on GitHub reach research memory, as the dashboard's do: a signed webhook
delivery (a PR merged or closed, a review, an `/autopilot` command) and a periodic
reconciliation that reads the PRs still awaiting review and applies what no delivery brought.

Both go through the cycle's lifecycle: a cycle decided already (by the other path, by the
dashboard, by a delivery seen twice) refuses a second decision, read here as "already decided",
so one decision reaches memory once. Each delivery id is also acted on once (the ops DB keeps
the ids seen). The merge on GitHub was the reviewer's: it is recorded, never merged again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from app.clock import utcnow
from app.cycles import review
from app.cycles.campaigns import review as campaigns
from app.cycles.campaigns.service import CampaignNotEnded
from app.cycles.exceptions import NotAwaitingReview
from app.db import Stores
from app.errors import AutopilotError, InvalidInput
from app.forge import repository
from app.forge.base import ForgeDecision, ProjectRef
from app.forge.exceptions import (
    CommandNotAllowed,
    WebhookNotConfigured,
    WebhookSignatureInvalid,
)
from app.forge.github import GitHubForge, github_repo
from app.projects import service as projects
from app.redaction import redact_text
from app.settings import Settings
from app.statemachine import IllegalMove

log = logging.getLogger(__name__)

SIGNATURE_PREFIX = "sha256="
#: How long a delivery id is remembered: GitHub redelivers (by hand) within days, not months.
KEEP_DELIVERIES = timedelta(days=30)
#: `/autopilot approve [note]`, `/autopilot reject <reason>`, `/autopilot rerun`: the first line
#: is the command, the rest of the comment belongs to the note.
_COMMAND = re.compile(r"\A/autopilot[ \t]+([a-z-]+)[ \t]*(.*)\Z", re.DOTALL)
COMMANDS = ("approve", "reject", "rerun")


@dataclass(frozen=True)
class Delivery:
    """One webhook request as it arrived: the headers that matter and the raw body."""

    event: str
    delivery_id: str
    signature: str | None
    body: bytes


@dataclass(frozen=True)
class Outcome:
    """What a delivery led to: 200 acted (or acted before), 202 acknowledged and ignored."""

    status: int
    outcome: str
    cycle_id: int | None = None


@dataclass(frozen=True)
class _Target:
    cycle_id: int  # 0 for a campaign's line
    project: ProjectRef
    number: int
    campaign_id: int | None = None  # the PR is a campaign's line (docs/design.md, "Research lines")


def verify_signature(settings: Settings, body: bytes, signature: str | None) -> None:
    """The delivery's `X-Hub-Signature-256` must be `sha256=` and the HMAC-SHA256 of the raw
    body with the webhook secret, compared in constant time; checked before the body is parsed."""
    secret = settings.github_webhook_secret
    key = secret.get_secret_value() if secret is not None else ""
    if not key:
        raise WebhookNotConfigured(
            "no webhook secret is set: set AUTOPILOT_GITHUB_WEBHOOK_SECRET to the secret of the "
            "GitHub webhook (docs/operations.md, the GitHub webhook)"
        )
    expected = SIGNATURE_PREFIX + hmac.new(key.encode(), body, hashlib.sha256).hexdigest()
    given = (signature or "").strip()
    if not hmac.compare_digest(expected.encode(), given.encode("utf-8", "replace")):
        raise WebhookSignatureInvalid(
            "X-Hub-Signature-256 is missing or is not the HMAC-SHA256 of the body with the "
            "webhook's secret; check that GitHub's webhook and AUTOPILOT_GITHUB_WEBHOOK_SECRET "
            "hold the same secret"
        )


def receive(stores: Stores, settings: Settings, delivery: Delivery) -> Outcome:
    """Act on one signed delivery, once per delivery id; see the module's docstring."""
    verify_signature(settings, delivery.body, delivery.signature)
    if delivery.event == "ping":
        return Outcome(200, "pong")
    try:
        payload = json.loads(delivery.body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInput(
            "the delivery's body is not JSON; set the content type to application/json on GitHub"
        ) from None
    if not isinstance(payload, dict):
        raise InvalidInput("the delivery's body is not a JSON object")
    if not delivery.delivery_id or len(delivery.delivery_id) > 64:
        raise InvalidInput("X-GitHub-Delivery is missing or longer than 64 characters")
    if settings.forge != "github":
        return Outcome(202, "ignored: the forge is not GitHub (AUTOPILOT_FORGE)")
    plan = _plan(stores, settings, delivery.event, payload)
    if isinstance(plan, Outcome):
        return plan
    with stores.ops_session() as session:
        if not repository.claim_delivery(session, delivery.delivery_id, delivery.event):
            return Outcome(200, f"delivery {delivery.delivery_id} was acted on already")
    try:
        return plan.act()
    except Exception:
        # Not acted on after all: GitHub's redelivery (or the reconciliation) tries again.
        with stores.ops_session() as session:
            repository.forget_delivery(session, delivery.delivery_id)
        raise


@dataclass
class _Plan:
    """An action a delivery asks for, checked and ready: `act` runs it."""

    stores: Stores
    settings: Settings
    forge: GitHubForge
    target: _Target
    kind: str
    actor: str
    note: str = ""
    key: str = ""

    def act(self) -> Outcome:
        t = self.target
        if t.campaign_id is not None and self.kind in ("approved", "changes_requested", "rerun"):
            return Outcome(202, f"ignored: {self.kind} on campaign {t.campaign_id}'s line")
        if self.kind in ("approved", "changes_requested"):  # a review submitted on GitHub
            review.record_forge_review(self.stores, t.cycle_id, self.kind, self.actor, self.note)
            shown = f"review {self.kind} by {self.actor} shown on cycle {t.cycle_id}"
            return Outcome(200, shown, t.cycle_id)
        if self.kind == "rerun":
            new_id = review.rerun(self.stores, self.settings, t.cycle_id, self.actor, self.key)
            return Outcome(200, f"cycle {new_id} re-runs cycle {t.cycle_id}", t.cycle_id)
        if self.kind in ("merged", "closed"):
            found = ForgeDecision(self.kind, self.actor, "")  # type: ignore[arg-type]
            return apply_decision(self.stores, self.settings, self.forge, t, found)
        approve = self.kind == "approve"
        return _decide(self.stores, self.settings, t, approve, self.note, self.actor, False)


def _plan(
    stores: Stores, settings: Settings, event: str, payload: dict[str, Any]
) -> _Plan | Outcome:
    """What the delivery asks for, or why it is ignored (202); a command from a user who may
    not write to the repository is refused (403)."""
    action = str(payload.get("action") or "")
    if event == "pull_request":
        pr = _dict(payload.get("pull_request"))
        if action != "closed":
            return Outcome(202, f"ignored: pull_request {action or 'without action'}")
        number = pr.get("number")
        merged = bool(pr.get("merged"))
        by = _login(pr.get("merged_by")) if merged else None
        kind, actor = ("merged" if merged else "closed"), by or _login(payload.get("sender"))
        note = ""
    elif event == "pull_request_review":
        found = _dict(payload.get("review"))
        state = str(found.get("state") or "").lower()
        if action != "submitted" or state not in ("approved", "changes_requested"):
            return Outcome(202, f"ignored: a review {state or action or 'without state'}")
        number = _dict(payload.get("pull_request")).get("number")
        kind, actor = state, _login(found.get("user"))
        note = str(found.get("body") or "").strip()
    elif event == "issue_comment":
        issue, comment = _dict(payload.get("issue")), _dict(payload.get("comment"))
        body = str(comment.get("body") or "").strip()
        match = _COMMAND.match(body)
        if action != "created" or not issue.get("pull_request") or match is None:
            return Outcome(202, "ignored: not an /autopilot command on a pull request")
        kind, note = match.group(1), match.group(2).strip()
        if kind not in COMMANDS:
            return Outcome(202, f"ignored: unknown command /autopilot {kind[:32]}")
        number, actor = issue.get("number"), _login(comment.get("user"))
        if kind == "reject" and not note:
            raise InvalidInput("/autopilot reject needs a reason after it (the refutation)")
    else:
        return Outcome(202, f"ignored: event {event[:64]!r}")
    if not isinstance(number, int) or not actor:
        raise InvalidInput(f"the {event} payload names no pull request number or user")
    target = _target(stores, settings, payload, number)
    if isinstance(target, Outcome):
        return target
    forge = GitHubForge.from_settings(settings)
    if event == "issue_comment":
        if not forge.can_write(target.project, actor):
            raise CommandNotAllowed(
                f"GitHub user {actor!r} may not write to the repository of project "
                f"{target.project.name!r}; only a user with write access decides with "
                "/autopilot commands"
            )
        comment_id = _dict(payload.get("comment")).get("id")
        return _Plan(stores, settings, forge, target, kind, actor, note, f"comment-{comment_id}")
    return _Plan(stores, settings, forge, target, kind, actor, note)


def _target(
    stores: Stores, settings: Settings, payload: dict[str, Any], number: int
) -> _Target | Outcome:
    """The cycle of the payload's repository and PR number, or why it is ignored."""
    full_name = str(_dict(payload.get("repository")).get("full_name") or "").lower()
    with stores.ops_session() as session:
        matching = [
            (p.id, ProjectRef.of(p))
            for p in projects.list_projects(session)
            if _repo_name(p.repo_url) == full_name
        ]
    if not full_name or not matching:
        return Outcome(202, f"ignored: no project's repository is {full_name[:140]!r}")
    project = next(ref for _, ref in matching)
    cycle_id = review.cycle_of_pull_request(stores, [p for p, _ in matching], number)
    if cycle_id is None:
        campaign_id = campaigns.campaign_of_pull_request(stores, [p for p, _ in matching], number)
        if campaign_id is None:
            return Outcome(202, f"ignored: pull request #{number} is no cycle's or campaign's")
        return _Target(0, project, number, campaign_id)
    return _Target(cycle_id, project, number)


def _repo_name(url: str) -> str | None:
    try:
        return github_repo(url).lower()
    except AutopilotError:
        return None


def apply_decision(
    stores: Stores, settings: Settings, forge: GitHubForge, target: _Target, found: ForgeDecision
) -> Outcome:
    """A PR merged on GitHub approves its cycle (recorded, not merged again); one closed
    unmerged rejects it, with the last note a person left on it. Idempotent on the cycle."""
    actor = found.actor or "github"
    if found.state == "merged":
        return _decide(stores, settings, target, True, "merged on GitHub", actor, True)
    if found.state == "closed":
        note = found.note or forge.last_note(target.project, target.number)
        note = note or f"closed on GitHub by {actor} without a note"
        return _decide(stores, settings, target, False, note, actor, True)
    return Outcome(202, f"pull request #{target.number} is still open", target.cycle_id or None)


def _decide(
    stores: Stores,
    settings: Settings,
    target: _Target,
    approve: bool,
    note: str,
    actor: str,
    on_forge: bool,
) -> Outcome:
    decision = "approved" if approve else "rejected"
    if target.campaign_id is not None:
        return _decide_campaign(stores, settings, target, approve, note, actor, on_forge)
    try:
        review.review(
            stores,
            settings,
            target.cycle_id,
            approve=approve,
            note=redact_text(note)[:10_000],
            actor=actor[:64],
            on_forge=on_forge,
        )
    except (NotAwaitingReview, IllegalMove):
        return Outcome(200, f"cycle {target.cycle_id} was decided already", target.cycle_id)
    return Outcome(200, f"cycle {target.cycle_id} {decision} by {actor}", target.cycle_id)


def _decide_campaign(
    stores: Stores,
    settings: Settings,
    target: _Target,
    approve: bool,
    note: str,
    actor: str,
    on_forge: bool,
) -> Outcome:
    campaign_id = int(target.campaign_id or 0)
    try:
        campaigns.review(
            stores,
            settings,
            campaign_id,
            approve=approve,
            note=redact_text(note)[:10_000],
            actor=actor[:64],
            on_forge=on_forge,
        )
    except (campaigns.CampaignDecided, CampaignNotEnded):
        return Outcome(200, f"campaign {campaign_id} was decided already")
    decision = "approved" if approve else "rejected"
    return Outcome(200, f"campaign {campaign_id} {decision} by {actor}")


def reconcile(stores: Stores, settings: Settings) -> list[str]:
    """Beat's check: every cycle awaiting review whose PR was merged or closed on GitHub is
    decided as the webhook would have; a PR the forge cannot read now waits for the next run.
    Old delivery ids are forgotten. Returns what was done, a line each."""
    with stores.ops_session() as session:
        repository.prune_deliveries(session, utcnow() - KEEP_DELIVERIES)
    if settings.forge != "github":
        return []
    forge = GitHubForge.from_settings(settings)
    done: list[str] = []
    for cycle_id, number, project in review.awaiting_on_forge(stores):
        target = _Target(cycle_id, project, number)
        try:
            found = forge.decision(project, number)
            if found.state == "open":
                continue
            done.append(apply_decision(stores, settings, forge, target, found).outcome)
        except AutopilotError as exc:  # one PR's trouble does not stop the others
            log.warning(
                "reconcile: cycle %s (PR #%s of %s): %s", cycle_id, number, project.name, exc.detail
            )
    for campaign_id, number, project in campaigns.awaiting_on_forge(stores):
        target = _Target(0, project, number, campaign_id)
        try:
            found = forge.decision(project, number)
            if found.state != "open":
                done.append(apply_decision(stores, settings, forge, target, found).outcome)
        except AutopilotError as exc:
            log.warning(
                "reconcile: campaign %s (PR #%s of %s): %s",
                campaign_id,
                number,
                project.name,
                exc.detail,
            )
    return done


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _login(user: object) -> str:
    return str(_dict(user).get("login") or "")[:64]
