"""What a cycle writes for people: the report's context, the pull request's title and body.
The ratio and verdict wording itself is `headline.py`'s."""

from __future__ import annotations

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
        method="paired, interleaved A/B runs; median ratio with a bootstrap 95% CI; A/A noise "
        "floor; accuracy gate before speed",
        lessons=list(proposal.get("proposed_lessons") or []),
        reproduce=f"autopilot job submit --project {project.name} --experiment "
        f"{cycle.experiment} " + " ".join(f"--param {p}" for p in params.split()),
        base_sha=cycle.base_sha,
    )


def pr_title(cycle: Cycle) -> str:
    return f"[autopilot] {cycle.experiment}: {cycle.verdict} ({ratio_text(cycle.headline)})"


def pr_body(cycle: Cycle) -> str:
    return (
        f"Autopilot cycle {cycle.id}.\n\n**Hypothesis**: {cycle.hypothesis}\n\n"
        f"**Verdict**: {cycle.verdict}, {ratio_text(cycle.headline)}\n\n"
        f"The report is in `{report.results_dir(str(cycle.id))}/REPORT.md`."
    )
