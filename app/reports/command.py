"""REPORT.md sections and plot.svg for a command experiment: the lab's own script run in
interleaved blocks, the baseline arm (base commit, the experiment's default parameters) against
the candidate arm (the cycle's head commit, the proposal's parameters).

`report.py` lays out the report and calls in here where a command result differs from a
harness one; this module knows only the judged command result's layout.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from statistics import median
from typing import TYPE_CHECKING, Any

from app.reports.format import TITLE_Y, cell, code_block, code_span, number, render_svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

KIND = "command"
# Each block runs the candidate once and the baseline twice; the second baseline run
# (`baseline_aa`) pairs with the first as the A/A control. (role, arm, label), in plot order.
ROLES = (
    ("baseline", "baseline", "baseline"),
    ("baseline_aa", "baseline", "baseline A/A"),
    ("candidate", "candidate", "candidate"),
)
_COMMIT = re.compile(r"[0-9a-fA-F]{7,64}")
_COLOURS = {"baseline": "C0", "baseline_aa": "C7", "candidate": "C1"}


#: What the interval of a result is, as reports and pull requests name it: a fixed design's
#: bootstrap interval, or the stopping rule's, which stays valid however often the rule looked
#: (docs/design.md, "Sequential verdicts").
FIXED_INTERVAL = "95% bootstrap CI"
SEQUENTIAL_INTERVAL = "the stopping rule's repeated 95% interval"


def interval_kind(result_or_headline: Mapping[str, Any] | None) -> str:
    """`FIXED_INTERVAL`, or `SEQUENTIAL_INTERVAL` where the blocks stopped by the rule (the
    result's or its headline's `stopped`)."""
    stopped = (result_or_headline or {}).get("stopped")
    return SEQUENTIAL_INTERVAL if isinstance(stopped, dict) and stopped else FIXED_INTERVAL


def is_command(result: Mapping[str, Any]) -> bool:
    return result.get("kind") == KIND


# -- reading the result -------------------------------------------------------------------


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _runs(result: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    runs = result.get("runs")
    rows = [r for r in runs if isinstance(r, Mapping)] if isinstance(runs, list) else []
    return sorted(rows, key=lambda r: number(r.get("index")) or 0.0)


def _series(result: Mapping[str, Any], role: str, field: str = "value") -> list[float | None]:
    """A role's figures in block order: the judged `samples` (or `checks`), else its runs."""
    source = _mapping(result.get("samples" if field == "value" else "checks")).get(role)
    if isinstance(source, list):
        return [number(v) for v in source]
    return [number(run.get(field)) for run in _runs(result) if run.get("role") == role]


def _values(result: Mapping[str, Any], role: str, field: str = "value") -> list[float]:
    return [v for v in _series(result, role, field) if v is not None]


def block_ratios(result: Mapping[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Per block, candidate / baseline and the A/A pair's baseline / baseline."""
    baseline = _series(result, "baseline")
    ratios: dict[str, list[tuple[int, float]]] = {}
    for role, name in (
        ("candidate", "candidate / baseline"),
        ("baseline_aa", "A/A (baseline / baseline)"),
    ):
        pairs = zip(_series(result, role), baseline, strict=False)
        ratios[name] = [(i, v / b) for i, (v, b) in enumerate(pairs) if v is not None and b]
    return ratios


def _metrics(result: Mapping[str, Any]) -> tuple[str, str | None]:
    """The metric's name and the check gate's, if the experiment has one."""
    check = _mapping(result.get("check")).get("metric") or _mapping(result.get("checks")).get(
        "metric"
    )
    return str(result.get("metric") or "value"), str(check) if check else None


def _better(direction: Any) -> str:
    return {"lower": "lower is better", "higher": "higher is better"}.get(str(direction), "")


def _interval(section: Mapping[str, Any]) -> str | None:
    ratio, low, high = (number(section.get(k)) for k in ("ratio", "ci_low", "ci_high"))
    if ratio is None:
        return None
    if low is None or high is None:
        return f"{ratio:.3f}"
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}]"


def _arm(result: Mapping[str, Any], arm: str) -> Mapping[str, Any]:
    return _mapping(_mapping(result.get("arms")).get(arm))


def _sha(arm: Mapping[str, Any]) -> str | None:
    """The arm's commit, if it is one: it goes into lines a reviewer pastes into a shell."""
    commit = arm.get("commit")
    return commit if isinstance(commit, str) and _COMMIT.fullmatch(commit) else None


def _parameters(arm: Mapping[str, Any]) -> str:
    params = _mapping(arm.get("parameters"))
    return ", ".join(f"{k}={v}" for k, v in params.items()) or "defaults"


def command_line(arm: Mapping[str, Any]) -> str | None:
    """The arm's argv as one shell-quoted line, as it could be pasted into a shell."""
    command = arm.get("command")
    if not isinstance(command, list) or not command:
        return None
    return shlex.join(str(part) for part in command)


# -- REPORT.md ----------------------------------------------------------------------------


def method_lines(result: Mapping[str, Any]) -> list[str]:
    """How the runs were laid out and judged, and the exact command of each arm."""
    metric, check = _metrics(result)
    repeats = number(result.get("repeats"))
    # Counted from the runs where they are listed: they show what ran, whatever the setting.
    runs = _runs(result)
    warmups = (
        sum(run.get("role") == "warmup" for run in runs)
        if runs
        else number(result.get("warmup_runs"))
    )
    where = (
        [f"experiment {code_span(str(result['experiment']))}"] if result.get("experiment") else []
    )
    if result.get("device"):
        where.append(f"on {code_span(str(result['device']))}")
    blocks = f"{int(repeats)} interleaved blocks" if repeats else "interleaved blocks"
    warm = (
        f" after {int(warmups)} warm-up run{'s' if warmups != 1 else ''} (not judged)"
        if warmups
        else ""
    )
    better = f" ({_better(result.get('direction'))})" if _better(result.get("direction")) else ""
    text = (
        f"The lab's own command{', ' + ' '.join(where) if where else ''}, ran in {blocks}{warm}; "
        "each block ran the candidate once and the baseline twice, the second baseline run "
        "pairing with the first as the A/A control that sets the noise floor. The ratio "
        f"candidate / baseline of {code_span(metric)}{better} is the median of the per-block "
        "ratios, with "
        + (
            f"{SEQUENTIAL_INTERVAL} (the blocks stopped when the rule decided)"
            if interval_kind(result) == SEQUENTIAL_INTERVAL
            else "a 95% bootstrap confidence interval"
        )
    )
    text += (
        f"; the check gate on {code_span(check)} is applied before the ratio is judged."
        if check
        else "."
    )
    commands = []
    for arm in ("baseline", "candidate"):
        section = _arm(result, arm)
        sha = _sha(section)
        commands.append(f"# {arm}" + (f" at {sha[:12]}" if sha else ""))
        commands.append(command_line(section) or "# (no command recorded)")
    evaluator = _mapping(result.get("evaluator"))
    if evaluator and command_line(evaluator):
        sha = _sha(evaluator)
        commands.append("# evaluator, after each run" + (f", at {sha[:12]}" if sha else ""))
        commands.append(command_line(evaluator) or "")
    return [
        text,
        "",
        source_line(result),
        "",
        "Commands run, each arm at its own commit:",
        "",
        *code_block(commands),
        "",
    ]


#: How REPORT.md and the pull request name each source of a number.
SOURCE_WORDS = {
    "output": "the program's own output (or metric file)",
    "wall": "the runner's clock, outside the sandbox (each run's wall time)",
    "evaluator": "the hold-out evaluator of the base commit, on the run's artifacts",
    "harness": "the harness",
}


def source_line(result: Mapping[str, Any]) -> str:
    """Where the metric and the check value came from, in one line."""
    integrity = _mapping(result.get("integrity"))
    metric, check = _metrics(result)
    source = str(integrity.get("metric_source") or result.get("metric_source") or "output")
    text = f"{code_span(metric)} comes from {SOURCE_WORDS.get(source, code_span(source))}"
    check_source = integrity.get("check_source") or result.get("check_source")
    if check and check_source:
        text += f"; the check value from {SOURCE_WORDS.get(str(check_source), '?')}"
    return text + "."


def integrity_lines(result: Mapping[str, Any]) -> list[str]:
    """A warning block where a number is the candidate's own word (self-reported): such a
    verdict is never a trusted win (docs/design.md, "Where a number comes from")."""
    integrity = _mapping(result.get("integrity"))
    flags = integrity.get("flags")
    if not is_command(result) or result.get("trusted") is not False or not isinstance(flags, list):
        return []
    return [
        "> [!WARNING]",
        "> **Self-reported: not a trusted win.** The verdict's numbers include the "
        "candidate's own word, so whatever they say, this result can never be kept:",
        ">",
        *(f"> - {cell(str(line))}" for line in flags),
        "",
    ]


def check_gate(result: Mapping[str, Any]) -> str:
    """The check gate's outcome in one line (REPORT.md and the pull request say the same)."""
    metric, name = _metrics(result)
    gate = _mapping(result.get("check"))
    if not gate:
        return (
            f"No check gate: the experiment declares none, so only {code_span(metric)} is judged."
        )
    terms = [t for t in (_better(gate.get("direction")),) if t]
    tolerance = number(gate.get("tolerance"))
    if tolerance is not None:
        terms.append(f"tolerance {tolerance * 100:.3g}%")
    passed = gate.get("pass")
    status = "pass" if passed else ("fail" if passed is not None else "not decided")
    medians = ", ".join(
        f"{arm} median {cell(number(gate.get(arm)))}" for arm in ("baseline", "candidate")
    )
    text = f"Check gate {code_span(name or '?')}" + (f" ({', '.join(terms)})" if terms else "")
    text += f": **{status}**; {medians}"
    reason = gate.get("reason")
    return text + (f": {cell(reason)}." if reason and not passed else ".")


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def arms_table(result: Mapping[str, Any]) -> list[str]:
    """One row per arm (and the A/A baseline run): its commit, parameters and medians."""
    metric, check = _metrics(result)
    header = ["arm", "commit", "parameters", "runs", f"median {metric}", "min", "max"]
    header += [f"median {check}"] if check else []
    lines = [_row([cell(h) for h in header]), _row(["---"] * len(header))]
    for role, arm, label in ROLES:
        values = _values(result, role)
        if not values and role == "baseline_aa":
            continue
        section = _arm(result, arm)
        sha = _sha(section)
        cells = [
            label,
            code_span(sha[:12]) if sha else "–",
            cell(_parameters(section)),
            str(len(values)),
            *(cell(f(values)) if values else "–" for f in (median, min, max)),
        ]
        if check:
            checks = _values(result, role, "check")
            cells.append(cell(median(checks)) if checks else "–")
        lines.append(_row(cells))
    return [*lines, ""]


def _runs_table(result: Mapping[str, Any]) -> list[str]:
    runs = _runs(result)
    if not runs:
        return ["No runs recorded.", ""]
    metric, check = _metrics(result)
    header = [
        "run",
        "block",
        "arm",
        "role",
        metric,
        check or "check",
        "exit",
        "duration (s)",
        "log",
    ]
    lines = [_row([cell(h) for h in header]), _row(["---"] * len(header))]
    for run in runs:
        log = run.get("log")
        lines.append(
            _row(
                [
                    cell(run.get("index")),
                    cell(run.get("block")),
                    cell(run.get("arm")),
                    cell(run.get("role")),
                    cell(number(run.get("value"))),
                    cell(number(run.get("check"))),
                    cell(run.get("exit_code")),
                    cell(number(run.get("duration_s"))),
                    code_span(str(log)) if log else "–",
                ]
            )
        )
    return [*lines, ""]


def results_lines(result: Mapping[str, Any]) -> list[str]:
    """The ratio and its CI, the noise floor, the check gate, each arm and each run."""
    metric, _ = _metrics(result)
    interval = _interval(result)
    stopped = _mapping(result.get("stopped"))
    kind = interval_kind(result)
    if kind == SEQUENTIAL_INTERVAL:
        kind += ", valid however often it looked"
    lines = [
        f"Ratio candidate/baseline of {code_span(metric)}: **{interval}** ({kind})."
        if interval
        else "No ratio: the runs gave no paired blocks to compare.",
        "",
    ]
    if stopped:
        lines += [stop_line(result), ""]
    noise = _mapping(result.get("noise_floor"))
    floor = number(noise.get("floor"))
    if floor is not None:
        aa, n = _interval(noise), number(noise.get("n"))
        detail = ", ".join(
            part
            for part in (f"A/A ratio {aa}" if aa else "", f"{int(n)} blocks" if n else "")
            if part
        )
        lines += [f"A/A noise floor: {floor:.3g}" + (f" ({detail})." if detail else "."), ""]
    lines += [check_gate(result), "", "### Arms", "", *arms_table(result)]
    lines += ["![runs per arm and per-block ratios](plot.svg)", ""]
    return [*lines, "### Runs", "", *_runs_table(result)]


#: What each of the stopping rule's decisions means, in a report's words.
STOP_WORDS = {
    "effect": "decided: the difference crossed the rule's boundary and clears the noise floor",
    "equivalent": "decided: equivalent, the interval lies within the rule's margin",
    "max": "undecided at the maximum",
    "gate": "stopped: the quality gate failed at a look",
}


def stop_line(result: Mapping[str, Any]) -> str:
    """Where the blocks stopped, why, and the GPU time that saved against the maximum (its
    blocks not run, at the median run's time)."""
    stopped = _mapping(result.get("stopped"))
    rule = _mapping(stopped.get("rule"))
    blocks, most = number(stopped.get("blocks")), number(rule.get("max_blocks"))
    saved = number(stopped.get("blocks_saved")) or 0
    durations = [d for d in (number(r.get("duration_s")) for r in _runs(result)) if d]
    text = (
        f"Blocks: {int(blocks or 0)} of at most {int(most or 0)}, "
        f"{STOP_WORDS.get(str(stopped.get('decision')), str(stopped.get('decision')))}"
    )
    if saved and durations:
        seconds = 3 * saved * median(durations)
        text += f"; {int(saved)} blocks not run saved about {seconds:.3g} GPU s"
    return text + "."


def reproduce_lines(result: Mapping[str, Any]) -> list[str]:
    """Each arm by hand: check out its commit, run its command (each was run once per block)."""
    lines = []
    for arm in ("baseline", "candidate"):
        section = _arm(result, arm)
        sha, command = _sha(section), command_line(section)
        if not command:
            continue
        lines += [f"# {arm}"] + ([f"git checkout {shlex.quote(sha)}"] if sha else []) + [command]
    if not lines:
        return []
    return ["Each arm by hand, at its own commit:", "", *code_block(lines), ""]


# -- plot.svg -----------------------------------------------------------------------------


def _spread(count: int, width: float = 0.3) -> list[float]:
    """Fixed horizontal offsets for a strip of points (no random jitter: the SVG must not
    change between two renderings)."""
    if count < 2:
        return [0.0] * count
    return [-width / 2 + width * i / (count - 1) for i in range(count)]


def _draw_runs(
    ax: Axes, result: Mapping[str, Any], groups: list[tuple[str, str, list[float]]]
) -> None:
    metric, _ = _metrics(result)
    for position, (role, _label, values) in enumerate(groups):
        ax.boxplot(
            [values],
            positions=[position],
            widths=0.5,
            showfliers=False,
            manage_ticks=False,
            medianprops={"color": "black"},
        )
        xs = [position + dx for dx in _spread(len(values))]
        ax.scatter(xs, values, s=14, alpha=0.8, color=_COLOURS[role], zorder=3)
    ax.set_xticks(range(len(groups)), [label for _, label, _ in groups])
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel(metric)
    better = _better(result.get("direction"))
    ax.set_title(f"{metric} per run" + (f" ({better})" if better else ""), y=TITLE_Y)


def _draw_ratios(
    ax: Axes, result: Mapping[str, Any], ratios: dict[str, list[tuple[int, float]]]
) -> None:
    low, high = number(result.get("ci_low")), number(result.get("ci_high"))
    if low is not None and high is not None:
        ax.axhspan(low, high, color=_COLOURS["candidate"], alpha=0.15, label="95% CI of the ratio")
    for (name, points), role in zip(ratios.items(), ("candidate", "baseline_aa"), strict=True):
        if points:
            ax.plot(
                [b for b, _ in points],
                [r for _, r in points],
                marker="o",
                color=_COLOURS[role],
                label=name,
            )
    from matplotlib.ticker import MaxNLocator

    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="no difference")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("block")
    ax.set_ylabel("ratio")
    ax.set_title("Per-block ratios", y=TITLE_Y)
    ax.legend(loc="best", fontsize="small")


def render_plot(result: Mapping[str, Any]) -> str:
    """The metric per run for each arm (a box with every run a point), and the per-block
    ratios candidate / baseline and A/A around a line at 1."""
    groups = [(role, label, v) for role, _arm, label in ROLES if (v := _values(result, role))]
    ratios = block_ratios(result)
    has_ratios = any(ratios.values())
    panels = int(bool(groups)) + int(has_ratios)

    def draw(axes: Sequence[Axes]) -> None:
        if groups:
            _draw_runs(axes[0], result, groups)
        if has_ratios:
            _draw_ratios(axes[panels - 1], result, ratios)
        if not panels:
            axes[0].text(0.5, 0.5, "result.json has no runs to plot", ha="center", va="center")
            axes[0].set_axis_off()

    return render_svg(panels, draw)
