"""What a cycle writes for people: the report's context, the pull request's title and body.
The ratio and verdict wording itself is `headline.py`'s."""

from __future__ import annotations

from typing import Any

from app.cycles.headline import ratio_text
from app.cycles.models import Cycle
from app.forge import report
from app.forge.base import ProjectRef


def report_context(cycle: Cycle, project: ProjectRef) -> report.ReportContext:
    proposal = cycle.proposal or {}
    params = " ".join(f"{k}={v}" for k, v in sorted((cycle.parameters or {}).items()))
    return report.ReportContext(
        cycle_id=str(cycle.id),
        project=project.name,
        hypothesis=cycle.hypothesis or "",
        changes=cycle.changed_hypothesis or str(proposal.get("what_changed") or ""),
        method=_method(cycle.headline or {}),
        lessons=list(proposal.get("proposed_lessons") or []),
        reproduce=f"autopilot job submit --project {project.name} --experiment "
        f"{cycle.experiment} " + " ".join(f"--param {p}" for p in params.split()),
        base_sha=cycle.base_sha,
    )


def _method(headline: dict[str, Any]) -> str:
    arms = (
        "the baseline (base commit, the experiment's defaults) against the candidate (the "
        "cycle's head commit, its parameters), runs interleaved in seeded random blocks with an "
        "A/A baseline pair each; median paired ratio with a bootstrap 95% CI; A/A noise floor"
    )
    if headline.get("kind") == "command":
        return f"{arms}; the check gate before the metric"
    in_process = (
        "paired, interleaved A/B runs; median ratio with a bootstrap 95% CI; A/A noise "
        "floor; accuracy gate before speed"
    )
    if isinstance(headline.get("in_process"), dict):  # the cycle changed code
        return (
            f"in process: {in_process}. Then head against base: the entry module at both "
            "commits, the headline variant's median time per run, runs interleaved in seeded "
            "random blocks with an A/A pair each; the verdict is head against base"
        )
    return in_process


def pr_title(cycle: Cycle) -> str:
    return f"[autopilot] {cycle.experiment}: {cycle.verdict} ({ratio_text(cycle.headline)})"


def pr_body(cycle: Cycle) -> str:
    return (
        f"Autopilot cycle {cycle.id}.\n\n**Hypothesis**: {cycle.hypothesis}\n\n"
        f"**Verdict**: {cycle.verdict}, {ratio_text(cycle.headline)}\n\n"
        f"The report is in `{report.results_dir(str(cycle.id))}/REPORT.md`."
    )
