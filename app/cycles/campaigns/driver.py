"""What moves a campaign (docs/design.md, "Research lines"): `advance(campaign_id)` makes the
next move its records allow, and again, until it waits on its cycles or ends.

    running:   make the line (once) -> a round of `parallel` step cycles at the tip
               -> each step judged: discarded, or a confirmation cycle (fresh seed, same tip)
               -> confirmed steps of the round: the best advances the line, the others are
                  superseded -> the next round, or finishing when a limit is reached
    finishing: the final cycle (the tip against the start) -> cumulative result -> one PR
               -> finished (or stopped, when a person asked)

It is idempotent, like the cycle machine: every move is recorded in the ops DB in the same
transaction as the rows it makes, and git and the forge are asked only what is safe to ask
twice (a fast-forward push to where the line already is pushes nothing; a pull request is
opened or found). So a control worker killed at any point leaves a campaign that the next
doorbell (the reaper rings a campaign nothing moved for a while) carries on from, with every
step recorded once and the line advanced once per kept step.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app import broker, notify
from app.clock import utcnow
from app.cycles import service as cycles
from app.cycles.campaigns import limits, line, members, report, repository, review
from app.cycles.campaigns.context import NO_CHANGE
from app.cycles.campaigns.lifecycle import CAMPAIGN, ENDS, STEP
from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.judge import keep
from app.cycles.states import TERMINAL
from app.db import Stores
from app.errors import AutopilotError, InvalidInput, Unavailable
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git.exceptions import FetchFailed, PushFailed
from app.git.work import GitWork
from app.projects import service as projects
from app.redaction import redact_text
from app.settings import Settings

log = logging.getLogger(__name__)

#: A step's cycle that ended without a judged result: why it is discarded.
_ENDED = {"skipped_repeat": "repeat", "cancelled": "cancelled"}
_MAX_MOVES = 32  # one call's moves at most; the next doorbell goes on


@dataclass
class Driver:
    stores: Stores
    settings: Settings

    def advance(self, campaign_id: int) -> str:
        """Make moves until the campaign waits on its cycles or ends; its state."""
        with self._lock(campaign_id):
            state = ""
            for _ in range(_MAX_MOVES):
                try:
                    state, moved = self._move(campaign_id)
                except (Unavailable, FetchFailed, PushFailed, OSError) as exc:
                    # The forge or the network: it passes. The reaper rings the campaign again.
                    log.warning("campaign %s: waiting on git or the forge: %s", campaign_id, exc)
                    return state or "running"
                except AutopilotError as exc:
                    self._fail(campaign_id, exc.detail)
                    return "failed"
                except Exception as exc:  # a bug or a missing piece: fail it, never spin
                    log.exception("campaign %s: a move crashed", campaign_id)
                    self._fail(campaign_id, f"unexpected error: {type(exc).__name__}: {exc}")
                    return "failed"
                if not moved:
                    return state
            broker.ring_campaign(self.settings, campaign_id)  # more to do: a doorbell, not a loop
            return state

    # -- one move -----------------------------------------------------------------------------

    def _move(self, campaign_id: int) -> tuple[str, bool]:
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            state, started = campaign.state, campaign.start_sha is not None
            ref = ProjectRef.of(projects.get_project_by_id(session, campaign.project_id))
        if state in ENDS:
            return state, False
        if not started:
            return self._start_line(campaign_id, ref), True
        if state == "running":
            return "running", self._run(campaign_id, ref)
        return state, self._finish(campaign_id, ref)

    def _start_line(self, campaign_id: int, ref: ProjectRef) -> str:
        forge = forge_service.forge_for(self.settings, self.stores)
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            agent, experiment = campaign.agent, campaign.experiment
        branch, sha, config = line.start(GitWork(self.settings), forge, ref, campaign_id)
        # What the request named, checked against the config at the line's start (AutopilotError:
        # the campaign fails at once, saying what to change, before any GPU is asked).
        if experiment is not None:
            config.experiment(experiment)
        kind = config.agent.kind if agent is None else agent
        if kind == "sweep":
            raise InvalidInput(
                "a campaign's steps change code, and the sweep agent changes none: name a "
                "command or llm agent (agent = ...) or set [agent] kind in autopilot.toml"
            )
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            if campaign.start_sha is None:
                campaign.line_branch, campaign.start_sha, campaign.tip_sha = branch, sha, sha
                _touch(campaign)
            return campaign.state

    def _run(self, campaign_id: int, ref: ProjectRef) -> bool:
        """One move of a running campaign; False when it waits on its cycles."""
        rings: list[int] = []
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            current = [
                s for s in repository.steps(session, campaign_id) if s.round == campaign.round
            ]
            moved = False
            for step in current:
                if step.outcome is None:
                    moved |= self._judge_step(session, campaign, step, rings)
            if campaign.stop_requested:
                moved |= members.cancel_live(session, campaign, current)
            pending = any(s.outcome is None for s in current)
            confirmed = any(s.outcome == "confirmed" for s in current)
            if moved:
                _touch(campaign)
        for cycle_id in rings:  # after the commit
            broker.ring_advance(self.settings, cycle_id)
        if moved:
            return True
        if pending:
            return False
        # The round is decided: its confirmed best advances the line, then what comes next.
        if confirmed:
            self._keep_best(campaign_id, ref)
            return True
        return self._next_round(campaign_id)

    def _judge_step(
        self, session: Session, campaign: Campaign, step: CampaignStep, rings: list[int]
    ) -> bool:
        """Decide what can be decided of one step; whether anything moved."""
        cycle = cycles.get(session, step.cycle_id)
        if cycle.state not in TERMINAL:
            return False  # planned to analyzing, or waiting for a budget
        if cycle.state != "judged":
            reason = _ENDED.get(cycle.state, "failed")
            if reason == "failed" and NO_CHANGE in (cycle.error or ""):
                reason = "no_change"
            why = f"its cycle ended {cycle.state}" + (f": {cycle.error}" if cycle.error else "")
            _decide(step, "discarded", reason, f"Discarded ({reason}): {why}.")
            return True
        if cycle.candidate_sha == step.tip_sha:
            _decide(
                step,
                "discarded",
                "no_change",
                "Discarded (no change): its candidate is the tip itself (a point of the "
                "parameter space, with no code change); a line keeps commits.",
            )
            return True
        try:
            comparison = members.comparison(session, cycle.id)
        except (keep.KeepError, AutopilotError) as exc:
            _decide(step, "discarded", "failed", f"Discarded (failed): {exc}.")
            return True
        step.ratio, step.ci_low, step.ci_high = (
            comparison.ratio,
            comparison.ci_low,
            comparison.ci_high,
        )
        if not keep.needs_confirmation(comparison):
            outcome = keep.decide(comparison)
            assert isinstance(outcome, keep.Discard)
            _decide(step, "discarded", outcome.reason, outcome.sentence)
            return True
        if step.confirmation_cycle_id is None:
            if campaign.stop_requested:
                _decide(
                    step,
                    "discarded",
                    "stopped",
                    "Discarded (stopped): it won, but the campaign was stopped before its "
                    "confirmation ran; a win is kept only once confirmed.",
                )
                return True
            confirmation = members.new_cycle(
                campaign,
                role="confirmation",
                base_sha=step.tip_sha,
                candidate_sha=cycle.candidate_sha,
                experiment=cycle.experiment,
                parameters=cycle.parameters,
                hypothesis=f"Confirmation of cycle {cycle.id} on fresh blocks: {cycle.hypothesis}",
            )
            repository.add(session, confirmation)
            step.confirmation_cycle_id = confirmation.id
            rings.append(confirmation.id)
            return True
        confirming = cycles.get(session, step.confirmation_cycle_id)
        if confirming.state not in TERMINAL:
            return False
        if confirming.state != "judged":
            why = f"its confirmation (cycle {confirming.id}) ended {confirming.state}"
            if confirming.error:
                why += f": {confirming.error}"
            _decide(
                step, "discarded", "confirmation_failed", f"Discarded (confirmation failed): {why}."
            )
            return True
        try:
            outcome = keep.decide(comparison, members.comparison(session, confirming.id))
        except (keep.KeepError, AutopilotError) as exc:
            _decide(step, "discarded", "failed", f"Discarded (failed): {exc}.")
            return True
        if isinstance(outcome, keep.Keep):
            _decide(step, "confirmed", None, outcome.sentence)
        else:
            _decide(step, "discarded", outcome.reason, outcome.sentence)
        return True

    def _keep_best(self, campaign_id: int, ref: ProjectRef) -> None:
        """Advance the line to the round's best confirmed step and supersede the others."""
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            confirmed = [
                s
                for s in repository.steps(session, campaign_id)
                if s.round == campaign.round and s.outcome == "confirmed"
            ]
            candidates = [
                keep.Step(
                    str(s.cycle_id),
                    members.comparison(session, s.cycle_id),
                    members.comparison(session, int(s.confirmation_cycle_id or 0)),
                )
                for s in confirmed
            ]
            # Compared by their intervals, the steps must judge one metric: those on another
            # direction than the round's first confirmed step wait for the next tip.
            direction = candidates[0].comparison.direction
            settled: dict[str, keep.Outcome] = dict(
                keep.settle([c for c in candidates if c.comparison.direction == direction])
            )
            for other in candidates:
                if other.comparison.direction != direction:
                    settled[other.name] = keep.Discard(
                        "superseded",
                        "Discarded (superseded): confirmed, but on a metric another confirmed "
                        "step of this round does not share; the line takes one candidate per "
                        "tip, and this one may be proposed again at the new tip.",
                    )
            chosen = next(s for s in confirmed if isinstance(settled[str(s.cycle_id)], keep.Keep))
            to_sha = cycles.get(session, chosen.cycle_id).candidate_sha
            start_sha, tip_sha = campaign.start_sha, campaign.tip_sha
        assert to_sha is not None
        assert start_sha is not None
        assert tip_sha is not None
        forge = forge_service.forge_for(self.settings, self.stores)
        line.advance(
            GitWork(self.settings),
            forge,
            ref,
            campaign_id,
            start_sha=start_sha,
            tip_sha=tip_sha,
            to_sha=to_sha,
        )
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            round_ = [
                s
                for s in repository.steps(session, campaign_id)
                if s.round == campaign.round and s.outcome == "confirmed"
            ]
            # The superseded first, the kept one last: a keep ends a run of steps not kept.
            for step in sorted(
                round_, key=lambda s: isinstance(settled[str(s.cycle_id)], keep.Keep)
            ):
                outcome = settled[str(step.cycle_id)]
                if isinstance(outcome, keep.Keep):
                    _decide(step, "kept", None, outcome.sentence)
                    step.kept_sha = to_sha
                else:
                    _decide(step, "discarded", outcome.reason, outcome.sentence)
            campaign.tip_sha = to_sha
            _touch(campaign)

    def _next_round(self, campaign_id: int) -> bool:
        """Start the next round at the tip, or move to finishing when a limit is reached."""
        rings: list[int] = []
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            steps = repository.steps(session, campaign_id)
            why = limits.why_end(campaign, steps)
            if why is not None:
                CAMPAIGN.move(campaign, "finishing")
                campaign.end_reason = campaign.end_reason or why
                _touch(campaign)
            else:
                campaign.round += 1
                for _ in range(min(campaign.parallel, campaign.max_cycles - len(steps))):
                    cycle = members.new_cycle(campaign, role="step", base_sha=str(campaign.tip_sha))
                    repository.add(session, cycle)
                    repository.add(
                        session,
                        CampaignStep(
                            campaign_id=campaign.id,
                            cycle_id=cycle.id,
                            round=campaign.round,
                            tip_sha=str(campaign.tip_sha),
                        ),
                    )
                    rings.append(cycle.id)
                _touch(campaign)
        for cycle_id in rings:  # after the commit
            broker.ring_advance(self.settings, cycle_id)
        return True

    # -- the end ------------------------------------------------------------------------------

    def _finish(self, campaign_id: int, ref: ProjectRef) -> bool:
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            steps = repository.steps(session, campaign_id)
            if any(s.outcome in (None, "confirmed") for s in steps):
                return False  # not reached: a round settles before the campaign finishes
            kept = [s for s in steps if s.outcome == "kept"]
            if not kept:
                _end(campaign, "; nothing was kept, so there is no pull request")
                return True
            if campaign.final_cycle_id is None:
                first = cycles.get(session, kept[0].cycle_id)
                final = members.new_cycle(
                    campaign,
                    role="final",
                    base_sha=str(campaign.start_sha),
                    candidate_sha=campaign.tip_sha,
                    experiment=campaign.experiment or first.experiment,
                    parameters=None,  # its defaults, as every step ran (`context.at_defaults`)
                    hypothesis=(
                        f"The line of campaign {campaign.id} ({len(kept)} kept step(s)) against "
                        "its start, on fresh runs: the cumulative result"
                    ),
                )
                repository.add(session, final)
                campaign.final_cycle_id = final.id
                _touch(campaign)
                ring: int | None = final.id
            else:
                ring = None
                final_cycle = cycles.get(session, campaign.final_cycle_id)
                if final_cycle.state not in TERMINAL:
                    return False
                if campaign.cumulative is None:
                    campaign.cumulative = members.cumulative(session, final_cycle)
                    _touch(campaign)
                    return True
        if ring is not None:
            broker.ring_advance(self.settings, ring)
            return True
        return self._open_pull_request(campaign_id, ref)

    def _open_pull_request(self, campaign_id: int, ref: ProjectRef) -> bool:
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            if campaign.pr_url is not None and campaign.finding_ids is not None:
                _end(campaign, "")
                return True
            rows = repository.steps(session, campaign_id)
            body = report.pr_body(
                campaign, ref, rows, repository.cycles(session, [s.cycle_id for s in rows])
            )
            title = report.pr_title(campaign, rows)
            start_sha = str(campaign.start_sha)
            device_kind = projects.get_project_by_id(session, campaign.project_id).gpu_kind
        forge = forge_service.forge_for(self.settings, self.stores)
        git = GitWork(self.settings)
        branch = line.open_line(git, ref, campaign_id, start_sha)
        pr = forge_service.publish(
            git, forge, ref, branch, f"campaign-{campaign_id}", title=title, body=body
        )
        with self.stores.ops_session() as session:  # the PR is the campaign's whatever follows
            campaign = _get(session, campaign_id)
            campaign.pr_number, campaign.pr_url = pr.number, pr.url
        finding_ids = review.record_findings(self.stores, campaign_id, ref, device_kind, pr.url)
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            campaign.finding_ids = finding_ids
            _end(campaign, "")
            news = report.notice(campaign, ref, self.settings.dashboard_base_url)
        notify.announce(self.settings, news)  # never raises, never blocks the campaign
        return True

    # -- plumbing -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self, campaign_id: int) -> Iterator[None]:
        # One driver per campaign at a time on this control host, as the cycle machine's lock.
        folder = self.settings.state_dir.absolute() / "campaigns"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{campaign_id}.lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _fail(self, campaign_id: int, message: str) -> None:
        """End the campaign `failed`, and cancel its cycles still live: no GPU works for it."""
        log.warning("campaign %s failed: %s", campaign_id, message)
        with self.stores.ops_session() as session:
            campaign = _get(session, campaign_id)
            if campaign.state not in ENDS:
                CAMPAIGN.move(campaign, "failed", error=redact_text(message), finished_at=utcnow())
                _touch(campaign)
                for cycle_id in repository.live_cycles(session, campaign_id):
                    cycles.cancel(session, cycle_id, f"campaign {campaign_id} failed")


def _get(session: Session, campaign_id: int) -> Campaign:
    campaign = repository.get(session, campaign_id)
    if campaign is None:
        raise AssertionError(f"campaign {campaign_id} is gone")
    return campaign


def _touch(campaign: Campaign) -> None:
    campaign.updated_at = utcnow()


def _decide(step: CampaignStep, outcome: str, reason: str | None, sentence: str) -> None:
    STEP.move(step, outcome, reason=reason, sentence=sentence, decided_at=utcnow())


def _end(campaign: Campaign, note: str) -> None:
    CAMPAIGN.move(campaign, "stopped" if campaign.stop_requested else "finished")
    if note:
        campaign.end_reason = (campaign.end_reason or "") + note
    campaign.finished_at = utcnow()
    _touch(campaign)
