"""What a cycle writes for people: the report's context, the pull request's title and body.
The ratio and verdict wording itself is `headline.py`'s; the tables, gate, environment and
reproduce lines are the report's own (`app/reports/cycle.py`), so REPORT.md and the pull request
never disagree.

The body stands alone where most reviewers read it (GitHub): verdict, gate, results table,
plot, hypothesis, what changed, environment, how to reproduce, and links to the dashboard and
the findings. GitHub refuses a body over 65,536 characters, so a table too long for that is cut
with a note pointing at REPORT.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from app.cycles.headline import interval_text, ratio_text, trust_note
from app.cycles.models import Cycle
from app.forge.base import Forge, ProjectRef
from app.redaction import redact_text
from app.reports import command as report_command
from app.reports import cycle as report

MAX_BODY_CHARS = 65_536  # GitHub's limit on a pull request body
MAX_TEXT_CHARS = 8_000  # of one free-text section (hypothesis, what changed)


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
        source = report_command.SOURCE_WORDS.get(str(headline.get("metric_source") or "output"))
        sequential = report_command.SEQUENTIAL_INTERVAL
        if report_command.interval_kind(headline) == sequential:
            arms = arms.replace(
                "with a bootstrap 95% CI", f"with {sequential}, blocks stopped when decided"
            )
        return f"{arms}; the check gate before the metric; the metric from {source}"
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
    return (
        f"[autopilot] {cycle.experiment}: {cycle.verdict}{trust_note(cycle.headline)} "
        f"({ratio_text(cycle.headline)})"
    )


@dataclass(frozen=True)
class Links:
    """Where a pull request body points people: the plot image, the whole report, the
    cycle's dashboard page (where it is reviewed), its findings, the project's memory."""

    plot: str
    report: str
    dashboard: str
    findings: str
    memory: str


def links(cycle: Cycle, project: ProjectRef, forge: Forge, dashboard_url: str) -> Links:
    """The links of the cycle's committed report: on the forge's web view of the commit where
    it has one (GitHub), else on the dashboard (the local forge)."""
    page = f"{dashboard_url.rstrip('/')}/cycles/{cycle.id}"
    directory = report.results_dir(str(cycle.id))
    sha = cycle.commit_sha
    plot = forge.file_url(project, sha, f"{directory}/plot.svg") if sha else None
    whole = forge.file_url(project, sha, f"{directory}/REPORT.md") if sha else None
    return Links(
        # GitHub shows no image from a relative path in a PR body, and a raw.githubusercontent
        # URL fails for private repositories (the image proxy has no token). The blob page with
        # `?raw=true` is the form GitHub's own Markdown resolves for the viewer, private
        # repositories included; at the commit's sha it always shows this cycle's plot.
        plot=f"{plot}?raw=true" if plot else f"{page}/plot.svg",
        report=whole or f"{page}#report-h",
        dashboard=page,
        findings=f"{page}#own-h",
        memory=f"{dashboard_url.rstrip('/')}/memory?project={quote(project.name)}",
    )


def pr_body(
    cycle: Cycle,
    project: ProjectRef,
    result: dict[str, Any],
    where: Links,
    *,
    limit: int = MAX_BODY_CHARS,
) -> str:
    """The pull request's description from the judged `result` the cycle committed."""

    def build(table: Sequence[str]) -> str:
        return redact_text("\n".join(_sections(cycle, project, result, where, table)) + "\n")

    return _fit(build, report.results_table(result), where.report, limit)


def _short(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    text = text.strip() or "–"
    return text if len(text) <= limit else text[:limit] + "… (cut here; REPORT.md has it all)"


def _verdict_line(cycle: Cycle) -> str:
    headline = cycle.headline or {}
    interval = interval_text(headline)
    floor = headline.get("noise_floor")
    noise = f"; A/A noise floor {float(floor):.3g}" if isinstance(floor, int | float) else ""
    figures = (
        f"ratio {interval} (candidate / baseline, {report_command.interval_kind(headline)}{noise})"
        if interval
        else "no ratio"
    )
    return f"**Verdict: {cycle.verdict or 'none'}**{trust_note(headline)}, {figures}"


def _sections(
    cycle: Cycle,
    project: ProjectRef,
    result: dict[str, Any],
    where: Links,
    table: Sequence[str],
) -> list[str]:
    context = report_context(cycle, project)
    params = ", ".join(f"`{k}={v}`" for k, v in sorted((cycle.parameters or {}).items()))
    commits = ", ".join(
        f"{name} `{sha[:12]}`"
        for name, sha in (("base", cycle.base_sha), ("results commit", cycle.commit_sha))
        if sha
    )
    plot = (
        "runs per arm and per-block ratios"
        if report_command.is_command(result)
        else "paired samples"
    )
    return [
        _verdict_line(cycle),
        "",
        report.gate_line(result),
        "",
        f"Autopilot cycle {cycle.id} of project `{project.name}`, experiment "
        f"`{cycle.experiment}`" + (f"; {commits}" if commits else "") + ".",
        "",
        f"Review and decide on the [dashboard]({where.dashboard}) · "
        f"[the findings it proposes]({where.findings}) · "
        f"[all findings of `{project.name}`]({where.memory}) · "
        f"[the whole report, REPORT.md]({where.report})",
        "",
        *report.judgement_lines(result),
        "## Hypothesis",
        "",
        _short(context.hypothesis),
        "",
        *([f"Parameters: {params}", ""] if params else []),
        "## What changed",
        "",
        _short(context.changes),
        "",
        "## Results",
        "",
        *table,
        f"![{plot}]({where.plot})",
        "",
        "## Environment",
        "",
        *report.environment_lines(result),
        "",
        "## Reproduce",
        "",
        *report.reproduce_lines(result, context),
    ]


def _fit(build: Callable[[Sequence[str]], str], table: list[str], whole: str, limit: int) -> str:
    """The body within `limit` characters: the table's last rows dropped first (with a note
    saying how many and where they are), the end of the body cut as a last resort."""
    text = build(table)
    if len(text) <= limit:
        return text
    head, rows = table[:2], [line for line in table[2:] if line]
    total = len(rows)
    if total:
        note = f"more rows are not shown: a pull request body holds at most {limit} characters. "
        note += f"The whole table is in [REPORT.md]({whole})."
        over = len(text) - limit + len(note) + 16
        while rows and over > 0:
            over -= len(rows.pop()) + 1
        text = build([*head, *rows, "", f"{total - len(rows)} {note}", ""])
        if len(text) <= limit:
            return text
    cut = f"\n\n… (cut at {limit} characters; the whole report is in REPORT.md: {whole})\n"
    return text[: limit - len(cut)] + cut
