"""Where a command verdict's numbers come from: a metric or check value read from the output of
code the cycle changed is self-reported and never a trusted win; the runner's clock and the
base commit's evaluator are trusted; the runner's record must agree with the job's spec
(app/cycles/judge/command.py, and what REPORT.md, the PR and the headline say of it)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.cycles.exceptions import Unjudgeable
from app.cycles.headline import trust_note, verdict_statement
from app.cycles.judge.command import judge_command, judge_head_vs_base, trusted_win
from app.cycles.pull_request import Links, pr_body, pr_title
from app.forge.base import ProjectRef
from app.reports.cycle import ReportContext, render_markdown
from tests.integration.forge.pr_cycles import cycle_for

BASE, HEAD = "a" * 40, "b" * 40


def result(source: str | None, *, head: str = HEAD, check_source: str | None = None) -> dict:
    rng = random.Random(0)
    n = 8

    def run(base: float) -> float:
        return base * (1 + rng.gauss(0, 0.005))

    raw: dict[str, Any] = {
        "status": "ok",
        "kind": "command",
        "metric": "step_ms",
        "samples": {
            "baseline": [run(10.0) for _ in range(n)],
            "candidate": [run(5.0) for _ in range(n)],  # a clear "win"
            "baseline_aa": [run(10.0) for _ in range(n)],
        },
        "checks": {"baseline": [0.5] * n, "candidate": [0.5] * n},
        "arms": {"baseline": {"commit": BASE}, "candidate": {"commit": head}},
    }
    if source is not None:
        raw["metric_source"] = source
    if check_source is not None:
        raw["check_source"] = check_source
    return raw


def spec(source: str | None, check_source: str | None = None) -> dict[str, Any]:
    check = None
    if check_source is not None:
        check = {"direction": "lower", "tolerance": 0.02, "source": check_source}
    made: dict[str, Any] = {
        "seed": 3,
        "kind": "command",
        "metric": "step_ms",
        "direction": "lower",
        "time_metric": True,
        "check": check,
    }
    if source is not None:
        made["metric_source"] = source
    return made


def test_output_of_changed_code_is_self_reported_and_never_a_trusted_win() -> None:
    judged = judge_command(result("output"), spec("output"))
    assert judged["verdict"] == "faster"  # what the figures say...
    assert judged["self_reported"] is True and judged["trusted"] is False  # ...is not a keep
    assert judged["metric_source"] == "output"
    assert not trusted_win(judged)
    [flag] = judged["integrity"]["flags"]
    assert flag.startswith("self-reported: `step_ms`") and HEAD[:12] in flag
    head = judged["headline"]
    assert (head["self_reported"], head["trusted"]) == (True, False)
    assert trust_note(head) == " (self-reported: not a trusted win)"


def test_a_spec_written_before_sources_reads_as_output() -> None:
    judged = judge_command(result(None), spec(None))
    assert judged["metric_source"] == "output" and judged["trusted"] is False


def test_output_of_unchanged_code_is_the_base_programs_and_may_win() -> None:
    judged = judge_command(result("output", head=BASE), spec("output"))
    assert judged["self_reported"] is False and trusted_win(judged)
    assert trust_note(judged["headline"]) == ""


@pytest.mark.parametrize("source", ["wall", "evaluator"])
def test_the_runners_clock_and_the_evaluator_are_trusted(source: str) -> None:
    judged = judge_command(result(source), spec(source))
    assert judged["verdict"] == "faster" and judged["trusted"] is True
    assert judged["integrity"]["flags"] == [] and trusted_win(judged)


def test_a_check_the_changed_candidate_prints_is_self_reported_too() -> None:
    judged = judge_command(
        result("wall", check_source="output"), spec("wall", check_source="output")
    )
    assert judged["self_reported"] is False and judged["trusted"] is False
    assert judged["integrity"]["check_self_reported"] is True
    assert "self-reported check" in judged["integrity"]["flags"][0]
    judged = judge_command(
        result("wall", check_source="evaluator"), spec("wall", check_source="evaluator")
    )
    assert judged["trusted"] is True


def test_a_runner_record_that_disagrees_with_the_spec_is_unjudgeable() -> None:
    with pytest.raises(Unjudgeable, match="metric_source = 'wall'"):
        judge_command(result("output"), spec("wall"))
    with pytest.raises(Unjudgeable, match="check value from 'output'"):
        judge_command(result("wall", check_source="output"), spec("wall", check_source="evaluator"))
    with pytest.raises(Unjudgeable, match="metric_source 'clock'"):
        judge_command(result("clock"), spec("clock"))


def test_a_harness_entry_at_two_commits_is_not_self_reported() -> None:
    section = result("harness")
    del section["checks"]
    judged: dict[str, Any] = {"head_vs_base": section, "headline": {"accuracy_pass": True}}
    judge_head_vs_base(judged, {"seed": 1})
    assert judged["head_vs_base"]["trusted"] is True
    assert judged["headline"]["metric_source"] == "harness"


def test_report_says_self_reported_where_a_reviewer_reads_it() -> None:
    judged = judge_command(result("output"), spec("output"))
    context = ReportContext(cycle_id="7", project="lab", hypothesis="faster", changes="x")
    text = render_markdown(judged, context)
    assert "**Verdict: faster** (self-reported: not a trusted win)" in text
    assert "> **Self-reported: not a trusted win.**" in text
    assert "comes from the program's own output" in text
    trusted = render_markdown(judge_command(result("wall"), spec("wall")), context)
    assert "Self-reported" not in trusted and "the runner's clock" in trusted


def test_the_pull_request_says_self_reported_in_its_title_and_body() -> None:
    judged = judge_command(result("output"), spec("output"))
    cycle = cycle_for(judged, 9, "train")
    ref = ProjectRef("lab", "https://github.example/lab/research")
    links = Links("p.svg", "REPORT.md", "https://d/cycles/9", "https://d/f", "https://d/m")
    assert "faster (self-reported: not a trusted win) (ratio " in pr_title(cycle)
    body = pr_body(cycle, ref, judged, links)
    assert body.startswith("**Verdict: faster** (self-reported: not a trusted win), ratio ")
    assert "> **Self-reported: not a trusted win.**" in body
    assert "self-reported" in verdict_statement(cycle)
    trusted = judge_command(result("wall"), spec("wall"))
    assert "self-reported" not in pr_title(cycle_for(trusted, 10, "train"))
