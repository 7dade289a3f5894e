"""What a cycle's review page says its verdict rests on: where each number came from, what the
judge flagged and where a sequential comparison's blocks stopped, in the report's own words."""

from __future__ import annotations

import copy
from statistics import median
from typing import Any

from app.dashboard.grounds import SELF_REPORTED, UNCONFINED, Grounds
from app.reports.command import stop_line
from tests.unit.reports.test_command import command_result


def _stopped(result: dict[str, Any], blocks: int, decision: str, most: int) -> dict[str, Any]:
    """`result` as the judge leaves it when a rule stopped its blocks after `blocks`."""
    stopped = copy.deepcopy(result)
    stopped["stopped"] = {
        "blocks": blocks,
        "decision": decision,
        "blocks_saved": most - blocks,
        "rule": {"min_blocks": 3, "max_blocks": most, "alpha": 0.05, "margin": 0.02},
    }
    return stopped


def _judged(result: dict[str, Any], source: str, *, changed: bool = True) -> dict[str, Any]:
    judged = copy.deepcopy(result)
    reported = source == "output" and changed
    judged["integrity"] = {
        "metric_source": source,
        "check_source": "evaluator",
        "changed_code": changed,
        "self_reported": reported,
        "check_self_reported": False,
        "trusted": not reported,
        "flags": ["self-reported: `step_ms` was read from the output of code"] if reported else [],
    }
    judged["trusted"] = not reported
    return judged


def test_a_stopped_comparison_says_where_why_and_the_gpu_time_saved() -> None:
    result = _stopped(_judged(command_result(), "wall"), 3, "gate", 8)
    grounds = Grounds.of(result, result["headline"])
    durations = [run["duration_s"] for run in result["runs"]]
    saved = 3 * 5 * median(durations)
    assert grounds.stop == (
        "Blocks: 3 of at most 8, stopped: the quality gate failed at a look; "
        f"5 blocks not run saved about {saved:.3g} GPU s."
    )
    assert grounds.stop == stop_line(result)  # the report's own line
    assert grounds.interval_kind == "the stopping rule's repeated 95% interval"
    assert grounds.judged and grounds.trusted is True and grounds.flags == []
    assert [(s.figure, s.label, s.trusted) for s in grounds.sources] == [
        ("`step_ms`", "runner clock", True),
        ("check `val_loss`", "evaluator at the base commit", True),
    ]
    assert grounds.gate is not None and grounds.gate.startswith("Check gate `val_loss`")


def test_a_fixed_design_has_no_stop_line_and_a_bootstrap_interval() -> None:
    grounds = Grounds.of(_judged(command_result(), "evaluator"), None)
    assert grounds.stop is None and grounds.interval_kind == "95% bootstrap interval"


def test_the_candidates_own_word_is_flagged_and_so_is_an_unconfined_run() -> None:
    result = _judged(command_result(), "output")
    result["sandbox"] = "off"
    result["judgement"]["disagreements"] = ["The experiment reported `faster`; ..."]
    grounds = Grounds.of(result, None)
    assert grounds.trusted is False
    assert (grounds.sources[0].label, grounds.sources[0].trusted) == (SELF_REPORTED, False)
    assert grounds.flags == [
        "self-reported: `step_ms` was read from the output of code",
        "The experiment reported `faster`; ...",
        UNCONFINED,
    ]
    unchanged = Grounds.of(_judged(command_result(), "output", changed=False), None)
    assert (unchanged.sources[0].label, unchanged.sources[0].trusted) == ("program output", True)


def test_a_harness_run_that_changed_code_is_judged_head_against_base() -> None:
    section = _stopped(command_result(), 4, "effect", 10)
    section.update(kind="head_vs_base", metric_source="harness")
    result = {
        "status": "ok",
        "comparisons": [{"variant": "fused", "accuracy": {"pass": True}}],
        "head_vs_base": section,
        "judgement": {"by": "control-plane", "disagreements": []},
    }
    grounds = Grounds.of(result, None)
    assert grounds.stop == stop_line(section) and "Blocks: 4 of at most 10" in grounds.stop
    assert [(s.figure, s.label) for s in grounds.sources] == [
        ("time per run, head against base", "trusted harness"),
        ("accuracy", "trusted harness"),
    ]
    in_process = Grounds.of({**result, "head_vs_base": None}, None)
    assert in_process.stop is None
    assert in_process.sources[0].figure == "time per call"


def test_before_the_commit_the_headline_and_the_runners_record_say_it() -> None:
    headline = {
        "kind": "command",
        "metric": "loss",
        "metric_source": "evaluator",
        "self_reported": False,
        "trusted": True,
        "stopped": {"blocks": 4, "decision": "equivalent", "blocks_saved": 8, "max_blocks": 12},
    }
    grounds = Grounds.of({}, headline)
    assert grounds.stop == (
        "Blocks: 4 of at most 12, decided: equivalent, the interval lies within the rule's margin."
    )
    assert not grounds.judged and grounds.gate is None
    assert [(s.figure, s.label) for s in grounds.sources] == [
        ("`loss`", "evaluator at the base commit")
    ]
    raw = {"kind": "command", "status": "ok", "stopped": {"blocks": 5, "max_blocks": 9}}
    raw["stopped"]["decision"] = "max"
    assert Grounds.of(raw, None).stop == "Blocks: 5 of at most 9, undecided at the maximum."
