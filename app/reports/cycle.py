"""A cycle's report: `results/<cycle>/` with result.json, REPORT.md and plot.svg.

The files are rendered deterministically (sorted JSON, a fixed SVG hash salt and no date), so
writing the same result twice changes nothing and the commit step stays idempotent.
matplotlib is imported lazily with the Agg backend: only the commit step pays for it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from app.errors import InvalidInput
from app.reports import command as report_command
from app.reports import svg_text as svg_chart
from app.reports.format import cell as _cell
from app.reports.format import number as _num

RESULTS_DIR = "results"
_CYCLE_DIR = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ReportContext:
    """What the cycle knows besides the result: the why, the what and how to reproduce it."""

    cycle_id: str
    project: str
    hypothesis: str
    changes: str = ""
    method: str = ""
    lessons: Sequence[str] = ()
    reproduce: str = ""
    base_sha: str | None = None
    extra: Mapping[str, str] = field(default_factory=dict)


def results_dir(cycle_id: str) -> str:
    """`results/<cycle>` relative to the repository root, with the cycle id validated."""
    if not _CYCLE_DIR.fullmatch(cycle_id) or ".." in cycle_id:
        raise InvalidInput(f"cycle id {cycle_id!r} cannot name a results directory")
    return f"{RESULTS_DIR}/{cycle_id}"


def render_files(result: Mapping[str, Any], context: ReportContext) -> dict[str, bytes]:
    """The three files, by their path in the repository (`results/<cycle>/...`)."""
    directory = results_dir(context.cycle_id)
    text = json.dumps(result, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"
    return {
        f"{directory}/result.json": text.encode(),
        f"{directory}/REPORT.md": render_markdown(result, context).encode(),
        f"{directory}/plot.svg": render_plot(result).encode(),
    }


# -- reading the result -------------------------------------------------------------------


def _samples(entry: Mapping[str, Any]) -> tuple[list[float], list[float]] | None:
    samples = entry.get("samples")
    if not isinstance(samples, Mapping):
        return None
    a = [v for v in (_num(x) for x in samples.get("a_ns") or []) if v is not None]
    b = [v for v in (_num(x) for x in samples.get("b_ns") or []) if v is not None]
    if not a or len(a) != len(b):
        return None
    return a, b


def comparisons(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per candidate: the harness's `comparisons`, else the top-level headline."""
    rows = result.get("comparisons")
    if isinstance(rows, list) and rows:
        return [dict(r) for r in rows if isinstance(r, Mapping)]
    headline = {k: result.get(k) for k in ("ratio", "ci_low", "ci_high", "verdict", "n")}
    headline["variant"] = (
        (result.get("headline") or {}).get("variant", "candidate")
        if isinstance(result.get("headline"), Mapping)
        else "candidate"
    )
    if isinstance(result.get("samples"), Mapping):
        headline["samples"] = result["samples"]
    if isinstance(result.get("accuracy"), Mapping):
        headline["accuracy"] = result["accuracy"]
    return [headline] if any(v is not None for v in headline.values()) else []


def _time_unit(values: Sequence[float]) -> tuple[float, str]:
    """Scale from ns to a readable unit, chosen from the data's median."""
    mid = median(values) if values else 0.0
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if mid >= scale:
            return scale, unit
    return 1.0, "ns"


# -- REPORT.md ----------------------------------------------------------------------------


def _accuracy(entry: Mapping[str, Any]) -> str:
    acc = entry.get("accuracy")
    if not isinstance(acc, Mapping):
        return "–"
    passed = acc.get("pass")
    status = "pass" if passed else ("fail" if passed is not None else "?")
    err = _num(acc.get("max_rel_error"))
    reason = acc.get("reason")
    text = status + (f", max rel. error {err:.3g}" if err is not None else "")
    return text + (f" ({reason})" if reason and not passed else "")


def judgement_lines(result: Mapping[str, Any]) -> list[str]:
    """Who computed the figures, and a warning block where the experiment claimed otherwise
    (docs/design.md, "The code under test never judges itself": the control plane judges; the
    self-report is evidence, not the verdict)."""
    judgement = result.get("judgement")
    if not isinstance(judgement, Mapping):
        return []
    lines = [
        "The verdict and figures below were computed by the control plane from the "
        "experiment's raw samples and accuracy figures, not taken from its own report.",
        "",
    ]
    disagreements = judgement.get("disagreements")
    if isinstance(disagreements, list) and disagreements:
        lines += [
            "> [!WARNING]",
            "> **The experiment's self-report disagrees with the control plane.** "
            "The figures in this report are the control plane's; the experiment claimed:",
            ">",
            *(f"> - {_cell(line)}" for line in disagreements),
            "",
        ]
    lines += report_command.integrity_lines(result)
    if result.get("sandbox") == "off":
        lines += [
            "> [!CAUTION]",
            "> The experiment ran **unconfined** (`AUTOPILOT_SANDBOX=off` on its GPU host): it "
            "could read that host's files and environment.",
            "",
        ]
    not_judged = judgement.get("not_judged")
    if isinstance(not_judged, list) and not_judged:
        sections = ", ".join(f"`{_cell(name)}`" for name in not_judged)
        lines += [f"Not judged (as the experiment reported them): {sections}.", ""]
    return lines


def _harness_method(result: Mapping[str, Any], context: ReportContext) -> list[str]:
    method = context.method.strip()
    if not method:
        parts = [f"experiment `{result.get('experiment')}`"] if result.get("experiment") else []
        if result.get("device"):
            parts.append(f"on `{result['device']}`")
        if result.get("repeats"):
            parts.append(f"{result['repeats']} paired, interleaved rounds")
        method = (
            ", ".join(parts) + "; medians of paired time ratios (candidate / baseline, lower is "
            "faster) with bootstrap confidence intervals; accuracy is gated before speed."
        ).lstrip("; ")
    return [method, ""]


def variant_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The per-variant table (medians, ratio and CI, verdict, accuracy), as REPORT.md and the
    pull request show it."""
    if not rows:
        return ["No timing results.", ""]
    lines = [
        "| variant | baseline median | variant median | ratio (B/A) | CI low | CI high "
        "| verdict | accuracy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        pair = _samples(row)
        if pair:
            scale, unit = _time_unit(pair[0])
            a_med = f"{median(pair[0]) / scale:.4g} {unit}"
            b_med = f"{median(pair[1]) / scale:.4g} {unit}"
        else:
            a_med = b_med = "–"
        cells = [
            _cell(row.get("variant")),
            a_med,
            b_med,
            _cell(_num(row.get("ratio"))),
            _cell(_num(row.get("ci_low"))),
            _cell(_num(row.get("ci_high"))),
            _cell(row.get("verdict")),
            _accuracy(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _noise_and_baseline(result: Mapping[str, Any]) -> list[str]:
    lines: list[str] = []
    noise = result.get("noise_floor")
    if isinstance(noise, Mapping) and _num(noise.get("floor")) is not None:
        lines += [f"A/A noise floor: {_num(noise.get('floor')):.3g}.", ""]
    baseline = result.get("baseline")
    if isinstance(baseline, Mapping) and isinstance(baseline.get("accuracy"), Mapping):
        lines += [f"Baseline `{_cell(baseline.get('name'))}` accuracy: {_accuracy(baseline)}.", ""]
    return lines


def _harness_results(result: Mapping[str, Any], rows: list[dict[str, Any]]) -> list[str]:
    lines = variant_table(rows) + _noise_and_baseline(result)
    return [*lines, "![paired samples](plot.svg)", ""]


def gate_line(result: Mapping[str, Any]) -> str:
    """The gate applied before the ratio is judged, and its outcome: a command experiment's
    check gate, a harness experiment's accuracy gate (each variant against the baseline)."""
    if report_command.is_command(result):
        return report_command.check_gate(result)
    gated = [r for r in comparisons(result) if isinstance(r.get("accuracy"), Mapping)]
    if not gated:
        return "Accuracy gate: not reported by the experiment."
    failed = [r for r in gated if r["accuracy"].get("pass") is False]
    undecided = [r for r in gated if r["accuracy"].get("pass") is None]
    if failed or undecided:
        status, named = ("fail", failed) if failed else ("not decided", undecided)
        which = ", ".join(f"`{_cell(r.get('variant'))}` ({_accuracy(r)})" for r in named)
        return f"Accuracy gate: **{status}** for {which}."
    return f"Accuracy gate: **pass** ({len(gated)} of {len(gated)} variants within tolerance)."


def results_table(result: Mapping[str, Any]) -> list[str]:
    """The results table a reviewer reads first: per variant (harness) or per arm (command)."""
    if report_command.is_command(result):
        return report_command.arms_table(result)
    return variant_table(comparisons(result))


def environment_lines(result: Mapping[str, Any]) -> list[str]:
    """The result's environment as a list, one `key: value` per line (values cut at 300)."""
    env = result.get("environment")
    if not isinstance(env, Mapping) or not env:
        return ["–"]
    lines = []
    for key in sorted(env):
        value = env[key]
        shown = (
            json.dumps(value, sort_keys=True, default=str)
            if not isinstance(value, str | int | float | bool)
            else str(value)
        )
        lines.append(f"- {key}: `{shown[:300]}`")
    return lines


def reproduce_lines(result: Mapping[str, Any], context: ReportContext) -> list[str]:
    """How to run it again: each arm by hand (a command experiment), then the service's
    command for the whole comparison."""
    lines = report_command.reproduce_lines(result) if report_command.is_command(result) else []
    if lines and context.reproduce.strip():
        lines += ["The whole comparison again, through the service:", ""]
    if context.reproduce.strip():
        lines += ["```sh", context.reproduce.strip(), "```"]
    return lines or ["–"]


def render_markdown(result: Mapping[str, Any], context: ReportContext) -> str:
    rows = comparisons(result)
    verdict = result.get("verdict") or (rows[0].get("verdict") if rows else None)
    status = result.get("status")
    hypothesis = context.hypothesis.strip()
    lines = [
        f"# {hypothesis.splitlines()[0] if hypothesis else 'Cycle ' + context.cycle_id}",
        "",
        f"Project `{context.project}`, cycle `{context.cycle_id}`"
        + (f", base `{context.base_sha[:12]}`" if context.base_sha else "")
        + ".",
        "",
        f"**Verdict: {verdict or ('error' if status == 'error' else 'none')}**"
        + (" (self-reported: not a trusted win)" if result.get("trusted") is False else ""),
        "",
        *judgement_lines(result),
        "## Hypothesis",
        "",
        context.hypothesis.strip() or "–",
        "",
        "## What changed",
        "",
        context.changes.strip() or "–",
        "",
        "## Method",
        "",
    ]
    command = report_command.is_command(result)
    if command:
        method = context.method.strip()
        lines += ([method, ""] if method else []) + report_command.method_lines(result)
    else:
        lines += _harness_method(result, context)
    params = result.get("parameters")
    if isinstance(params, Mapping) and params:
        lines += ["Parameters: " + ", ".join(f"`{k}={v}`" for k, v in params.items()), ""]

    lines += ["## Results", ""]
    if status == "error" and isinstance(result.get("error"), Mapping):
        lines += [f"The experiment failed: {_cell(result['error'].get('message'))}", ""]
    lines += report_command.results_lines(result) if command else _harness_results(result, rows)

    lines += ["## Environment", "", *environment_lines(result)]
    lines += ["", "## Proposed lessons", ""]
    lines += [f"- {lesson}" for lesson in context.lessons] or ["–"]
    lines += ["", "## Reproduce", "", *reproduce_lines(result, context)]
    for key, value in context.extra.items():
        lines += ["", f"## {key}", "", value]
    return "\n".join(lines).rstrip() + "\n"


# -- plot.svg -----------------------------------------------------------------------------


def _sweep(result: Mapping[str, Any]) -> dict[str, list[tuple[float, float]]]:
    sweep = result.get("thread_sweep") or result.get("sweep")
    if not isinstance(sweep, Mapping) or not isinstance(sweep.get("points"), Mapping):
        return {}
    series: dict[str, list[tuple[float, float]]] = {}
    for name, points in sweep["points"].items():
        if not isinstance(points, list):
            continue
        pts = [
            (x, y)
            for p in points
            if isinstance(p, Mapping)
            and (x := _num(p.get("threads"))) is not None
            and (y := _num(p.get("calls_per_s"))) is not None
        ]
        if pts:
            series[str(name)] = pts
    return series


def render_plot(result: Mapping[str, Any]) -> str:
    """An SVG of the paired samples (variant vs baseline time) and the sweep, if present
    (`svg_chart`, written directly: every cycle's commit step makes one); a command
    experiment's runs and per-block ratios (`report_command.render_plot`, matplotlib)."""
    if report_command.is_command(result):
        return report_command.render_plot(result)
    paired = [(str(r.get("variant")), s) for r in comparisons(result) if (s := _samples(r))]
    sweep = _sweep(result)
    panels: list[svg_chart.Panel] = []
    if paired:
        scale, unit = _time_unit([v for _, (a, _b) in paired for v in a])
        series = [
            svg_chart.Series(name, [(x / scale, y / scale) for x, y in zip(a, b, strict=True)])
            for name, (a, b) in paired
        ]
        values = [v for s in series for point in s.points for v in point]
        low, high = min(values), max(values)
        series.append(svg_chart.Series("equal time", [(low, low), (high, high)], "dashed"))
        panels.append(
            svg_chart.Panel(
                "Paired samples (below the line: variant faster)",
                f"baseline time per call ({unit})",
                f"variant time per call ({unit})",
                series,
            )
        )
    if sweep:
        panels.append(
            svg_chart.Panel(
                "Thread sweep",
                "threads (count)",
                "throughput (calls/s)",
                [svg_chart.Series(name, pts, "line") for name, pts in sweep.items()],
            )
        )
    return svg_chart.render(panels, empty="result.json has no samples or sweep to plot")
