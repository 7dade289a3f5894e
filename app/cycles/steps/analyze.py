"""analyzing → committing (a campaign's cycle: judged): the control plane judges the result
(docs/design.md, "Accuracy gates before speed" and "The code under test never judges itself").

The verdict and headline stored on the cycle are the ones `judge.py` computed from the raw
samples, accuracy figures and the job's spec, never the experiment's own; a result that cannot
be judged fails the cycle, naming what is missing. `Job.result` stays the raw report: the
evidence of what the experiment claimed.
"""

from __future__ import annotations

from typing import Any

from app.cycles import repository, service
from app.cycles.exceptions import Unjudgeable
from app.cycles.headline import headline
from app.cycles.judge import judge
from app.cycles.steps.base import Step
from app.jobs import service as jobs


class Analyze(Step):
    FROM_STATES = ("analyzing",)
    TO_STATES = ("committing", "judged", "failed")

    def run(self, cycle_id: int) -> bool:
        # One session: judging is a pure computation (no git, forge or subprocess).
        with self.stores.ops_session() as session:
            job = jobs.for_cycle(session, cycle_id)
            raw = dict(job.result or {}) if job else {}
            spec = dict(job.spec or {}) if job else {}
            error, judged = _judge(raw, spec)
            cycle = service.get(session, cycle_id)
            if error is not None:
                repository.set_state(session, cycle, "failed", error=error)
                return True
            cycle.verdict = str(judged["verdict"])
            cycle.headline = headline(judged)
            # A campaign's cycle ends here: its campaign keeps or discards the candidate, and
            # the line's one pull request carries what was kept (docs/design.md, "Research lines").
            repository.set_state(
                session, cycle, "judged" if cycle.campaign_id is not None else "committing"
            )
        return True


def _judge(raw: dict[str, Any], spec: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """(why the result cannot be judged, or None; the judgement)."""
    if raw.get("status") != "ok":
        error = "the experiment produced no result"
        message = (raw.get("error") or {}) if isinstance(raw.get("error"), dict) else {}
        if message.get("message"):
            error += f": {message['message']}"
        return error, {}
    try:
        return None, judge(raw, spec)
    except Unjudgeable as exc:
        return (
            f"the result cannot be judged: {exc.detail}; the control plane computes the "
            "verdict from the raw samples and never takes the experiment's own"
        ), {}
