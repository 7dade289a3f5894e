"""The grounds of a cycle's verdict, for the top of its page: the headline's interval, where
each number came from and whether the candidate could have written it, what the judge flagged,
and where a sequential comparison's blocks stopped (docs/design.md, "Where a number comes from"
and "Sequential verdicts").

Read from the judged result the cycle committed, else from the headline the cycle keeps. The
gate's and the stop's wording is the report's own (`app.reports`), so the page and REPORT.md
never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.reports import command as report_command
from app.reports import cycle as report
from app.reports.format import number

#: A number's source in a word or three, as the reviewer scans for it.
SOURCE_LABELS = {
    "wall": "runner clock",
    "evaluator": "evaluator at the base commit",
    "harness": "trusted harness",
    "output": "program output",
}
SELF_REPORTED = "self-reported"
IN_PROCESS = (
    "the harness, in the job's process: raw samples of paired, interleaved calls, recomputed "
    "by the control plane"
)
ACCURACY = (
    "the harness's error figures against the reference, gated by the control plane at the "
    "job's tolerance"
)
UNCONFINED = (
    "The experiment ran unconfined (AUTOPILOT_SANDBOX=off on its GPU host): it could read that "
    "host's files and environment."
)


@dataclass(frozen=True)
class Source:
    """Where one number of the verdict came from, and whether a keep may rest on it."""

    figure: str  # what the number is: the metric, the check value, the time per call
    label: str  # SOURCE_LABELS' word, or `self-reported`
    detail: str  # the report's sentence for the source
    trusted: bool


@dataclass
class Grounds:
    """What a reviewer decides from, besides the verdict and its ratio."""

    judged: bool  # the control plane recomputed the figures (the result carries its judgement)
    interval_kind: str
    noise_floor: float | None = None
    trusted: bool | None = None
    gate: str | None = None  # Markdown, as REPORT.md writes it
    stop: str | None = None  # Markdown, as REPORT.md writes it
    sources: list[Source] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, result: Mapping[str, Any], headline: Mapping[str, Any] | None) -> Grounds:
        """The grounds from the judged `result` ({} when the cycle has none yet) and the cycle's
        `headline`."""
        h = _mapping(headline)
        # A harness run whose cycle changed code is judged head against base, by that section.
        decided = _mapping(result.get("head_vs_base")) or result
        stop = _stop(decided, h)
        judgement = _mapping(result.get("judgement"))
        trusted = result.get("trusted", h.get("trusted"))
        grounds = cls(
            judged=judgement.get("by") == "control-plane",
            interval_kind=(
                "the stopping rule's repeated 95% interval" if stop else "95% bootstrap interval"
            ),
            noise_floor=number(h.get("noise_floor")),
            trusted=trusted if isinstance(trusted, bool) else None,
            gate=report.gate_line(result) if result.get("status") == "ok" else None,
            stop=stop,
            sources=_sources(result, h),
        )
        integrity = _mapping(result.get("integrity"))
        flags = integrity.get("flags") if report_command.is_command(result) else None
        grounds.flags = [str(f) for f in flags] if isinstance(flags, list) else []
        lines = judgement.get("disagreements")
        grounds.flags += [str(line) for line in lines] if isinstance(lines, list) else []
        if result.get("sandbox") == "off":
            grounds.flags.append(UNCONFINED)
        return grounds


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _stop(decided: Mapping[str, Any], headline: Mapping[str, Any]) -> str | None:
    """The report's stop line, from the judged section (whose runs' times tell the GPU time the
    stop saved), else from the headline's summary of it or the runner's record."""
    stopped = _mapping(decided.get("stopped")) or _mapping(headline.get("stopped"))
    if not stopped:
        return None
    if not _mapping(stopped.get("rule")):  # a summary: it names the maximum itself
        stopped = {**stopped, "rule": {"max_blocks": stopped.get("max_blocks")}}
    return report_command.stop_line({**decided, "stopped": stopped})


def _source(figure: str, source: str, self_reported: bool) -> Source:
    detail = report_command.SOURCE_WORDS.get(source, source)
    label = SELF_REPORTED if self_reported else SOURCE_LABELS.get(source, source)
    return Source(figure, label, detail, not self_reported)


def _sources(result: Mapping[str, Any], headline: Mapping[str, Any]) -> list[Source]:
    if report_command.is_command(result) or (not result and headline.get("metric_source")):
        integrity = _mapping(result.get("integrity"))
        metric = str(result.get("metric") or headline.get("metric") or "the metric")
        source = str(
            integrity.get("metric_source")
            or result.get("metric_source")
            or headline.get("metric_source")
            or "output"
        )
        reported = bool(integrity.get("self_reported", headline.get("self_reported")))
        sources = [_source(f"`{metric}`", source, reported)]
        check = integrity.get("check_source")
        if check:
            name = _mapping(result.get("check")).get("metric") or "check value"
            sources.append(
                _source(f"check `{name}`", str(check), bool(integrity.get("check_self_reported")))
            )
        return sources
    if not result:
        return []
    defences = _defences(result)
    if _mapping(result.get("head_vs_base")):
        timing = _source("time per run, head against base", "harness", False)
    else:
        timing = Source("time per call", SOURCE_LABELS["harness"], IN_PROCESS + defences, True)
    return [timing, Source("accuracy", SOURCE_LABELS["harness"], ACCURACY, True)]


def _defences(result: Mapping[str, Any]) -> str:
    """What the harness's own checks recorded (a result whose checks failed is never judged)."""
    integrity = _mapping(result.get("integrity"))
    clock = integrity.get("clock")
    if not isinstance(clock, list) or not clock:
        return ""
    text = f"; each arm's samples agree with the clock outside the timer ({len(clock)} arms)"
    if integrity.get("harness_unchanged") is True:
        text += ", the harness unchanged after the run"
    return text
