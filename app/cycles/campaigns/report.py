"""The pull request of a campaign's line: a body that stands alone (each kept step with its
commit, hypothesis, ratio and interval; the cumulative result; what was discarded and why; how
to reproduce)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from app.cycles.campaigns.models import Campaign, CampaignStep
from app.cycles.judge.command import WINS
from app.cycles.models import Cycle
from app.forge.base import ProjectRef


def _figures(ratio: float | None, low: float | None, high: float | None) -> str:
    if ratio is None:
        return "-"
    if low is None or high is None:
        return f"{ratio:.4f}"
    return f"{ratio:.4f} [{low:.4f}, {high:.4f}]"


def _one_line(text: str | None) -> str:
    return (text or "").strip().splitlines()[0].replace("|", "\\|") if (text or "").strip() else ""


def pr_title(campaign: Campaign, steps: Sequence[CampaignStep]) -> str:
    kept = sum(1 for s in steps if s.outcome == "kept")
    c = campaign.cumulative or {}
    figure = f", cumulative ratio {c['ratio']:.3f}" if isinstance(c.get("ratio"), float) else ""
    if c.get("verdict") not in WINS:
        figure += " (not a win together)"
    return f"Research line: campaign {campaign.id}, {kept} kept step(s){figure}"


def pr_body(
    campaign: Campaign,
    project: ProjectRef,
    steps: Sequence[CampaignStep],
    cycles: Mapping[int, Cycle],
) -> str:
    kept = [s for s in steps if s.outcome == "kept"]
    dropped = [s for s in steps if s.outcome == "discarded"]
    c = campaign.cumulative or {}
    lines = [
        f"Campaign {campaign.id} of `{project.name}`: a line of cycles, each started at the "
        f"line's tip, that kept only candidates whose win was confirmed on fresh blocks with a "
        f"new seed. It ran {len(steps)} step(s) and kept {len(kept)}.",
        "",
        "## Cumulative result",
        "",
    ]
    if c.get("ratio") is not None:
        lines.append(
            f"The line's tip `{str(campaign.tip_sha)[:12]}` against its start "
            f"`{str(campaign.start_sha)[:12]}`, on fresh runs with the same judge "
            f"(cycle {c.get('cycle_id')}): ratio "
            f"{_figures(c['ratio'], c.get('ci_low'), c.get('ci_high'))}"
            f" (tip / start), verdict **{c.get('verdict')}**, measured by "
            f"{c.get('metric_source', 'the harness')}."
        )
    else:
        lines.append(f"Not measured: {c.get('error') or 'no final measurement'}.")
    if c.get("verdict") not in WINS:
        lines += [
            "",
            "**Read before approving: the line's tip is not measured better than its start** "
            "(each kept step won on its own tip, but together, on fresh runs, they did not). "
            "Approving validates the steps' findings all the same.",
        ]
    lines += [
        "",
        "## Kept steps, in order",
        "",
        "| step | commit | hypothesis | ratio [95% CI] |",
        "|---|---|---|---|",
    ]
    for s in kept:
        hyp = _one_line(getattr(cycles.get(s.cycle_id), "hypothesis", None))
        lines.append(
            f"| cycle {s.cycle_id} | `{str(s.kept_sha)[:12]}` | {hyp} | "
            f"{_figures(s.ratio, s.ci_low, s.ci_high)} |"
        )
    lines += ["", "## Discarded, and why", ""]
    if not dropped:
        lines.append("Nothing was discarded.")
    else:
        lines += ["| step | hypothesis | reason | ratio [95% CI] | why |", "|---|---|---|---|---|"]
        for s in dropped:
            hyp = _one_line(getattr(cycles.get(s.cycle_id), "hypothesis", None))
            lines.append(
                f"| cycle {s.cycle_id} | {hyp} | {s.reason} | "
                f"{_figures(s.ratio, s.ci_low, s.ci_high)} | {_one_line(s.sentence)} |"
            )
    lines += [
        "",
        "## How to reproduce",
        "",
        f"- The line is branch `{campaign.line_branch}`: `git log {str(campaign.start_sha)[:12]}.."
        f"{campaign.line_branch}` lists the kept commits.",
        f"- `autopilot campaign show {campaign.id}` (or `GET /api/v1/campaigns/{campaign.id}`) "
        "shows every step, its cycle and its confirmation.",
        "- Each step's cycle holds its job's raw result and the judge's reading of it; the "
        'keep rule is docs/experiments.md, "Keeping a step of a research line: error control '
        'over a campaign".',
        "",
        "Approving this pull request validates each kept step's finding and the cumulative one; "
        "rejecting it refutes them with the note.",
    ]
    if campaign.end_reason:
        lines += ["", f"Ended: {campaign.end_reason}."]
    return "\n".join(lines) + "\n"


def notice(campaign: Campaign, project: ProjectRef, dashboard: str) -> str:
    """What people are told when a campaign's line awaits review."""
    c = campaign.cumulative or {}
    figure = (
        f"cumulative ratio {_figures(c['ratio'], c.get('ci_low'), c.get('ci_high'))}"
        if c.get("ratio") is not None
        else "no cumulative measurement"
    )
    return (
        f"Campaign {campaign.id} of {project.name} {campaign.state}: {figure}. Review its line: "
        f"{campaign.pr_url} · {dashboard}/campaigns/{campaign.id}"
    )
