"""The judge's check of where a job's blocks stopped (app/cycles/judge/sequential.py, called by
judge_command when the spec carries a stopping rule)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from autopilot_harness import sequential

from app.cycles.exceptions import Unjudgeable
from app.cycles.judge.command import judge_command

RULE = sequential.Rule(max_blocks=12).as_dict()


def values(factor: float, n: int, noise: float, seed: int) -> dict[str, list[float]]:
    rng = random.Random(seed)
    return {
        "baseline": [10.0 * (1 + rng.gauss(0, noise)) for _ in range(n)],
        "candidate": [10.0 * factor * (1 + rng.gauss(0, noise)) for _ in range(n)],
        "baseline_aa": [10.0 * (1 + rng.gauss(0, noise)) for _ in range(n)],
    }


def spec(**over: Any) -> dict[str, Any]:
    return {
        "seed": 5,
        "kind": "command",
        "metric": "step_ms",
        "direction": "lower",
        "time_metric": True,
        "check": None,
        "metric_source": "wall",
        "sequential": RULE,
        **over,
    }


def where_it_stops(samples: dict[str, list[float]]) -> sequential.Look:
    rule = sequential.Rule.from_dict(RULE)
    stop = sequential.first_stop(
        rule, samples["baseline"], samples["candidate"], samples["baseline_aa"], seed=5
    )
    assert stop is not None
    return stop


def cut(samples: dict[str, list[float]], n: int) -> dict[str, list[float]]:
    return {role: v[:n] for role, v in samples.items()}


def test_a_stop_the_rule_makes_is_judged_with_the_rules_figures() -> None:
    full = values(1.5, 12, 0.01, seed=1)
    stop = where_it_stops(full)
    assert stop.decision == "effect" and stop.blocks < 12
    result = {
        "status": "ok",
        "samples": cut(full, stop.blocks),
        "stopped": {"blocks": stop.blocks, "decision": "effect"},
    }
    judged = judge_command(result, spec())
    assert judged["verdict"] == "slower"
    assert judged["n"] == stop.blocks and judged["ratio"] == pytest.approx(stop.ratio)
    assert judged["stopped"]["blocks_saved"] == 12 - stop.blocks
    assert judged["headline"]["stopped"]["max_blocks"] == 12


def test_a_forged_early_end_is_refused() -> None:
    """A noisy, small change the rule would go on with: the runs end after 4 blocks anyway,
    with a candidate that looked good so far. The judge does not take the stop."""
    full = values(0.97, 12, 0.05, seed=2)
    rule = sequential.Rule.from_dict(RULE)
    early = cut(full, 4)
    assert (
        sequential.first_stop(
            rule, early["baseline"], early["candidate"], early["baseline_aa"], seed=5
        )
        is None
    )
    result = {"status": "ok", "samples": early, "stopped": {"blocks": 4, "decision": "effect"}}
    with pytest.raises(Unjudgeable, match="does not support that stop"):
        judge_command(result, spec())


def test_runs_past_the_stop_and_a_stop_claimed_for_another_reason_are_refused() -> None:
    full = values(1.5, 12, 0.01, seed=1)
    stop = where_it_stops(full)
    longer = {"status": "ok", "samples": cut(full, stop.blocks + 2)}
    with pytest.raises(Unjudgeable, match="do not end where the rule stopped them"):
        judge_command(longer, spec())
    other = {
        "status": "ok",
        "samples": cut(full, stop.blocks),
        "stopped": {"blocks": stop.blocks, "decision": "equivalent"},
    }
    with pytest.raises(Unjudgeable, match="says it stopped for 'equivalent'"):
        judge_command(other, spec())


def test_an_unusable_rule_in_the_spec_is_named() -> None:
    result = {"status": "ok", "samples": values(1.0, 5, 0.01, seed=3)}
    with pytest.raises(Unjudgeable, match="unusable stopping rule"):
        judge_command(result, spec(sequential={"max_blocks": 2}))


GATE = {"direction": "lower", "tolerance": 0.05, "source": "evaluator"}


def test_a_gate_that_fails_at_the_first_look_stops_the_blocks_as_rejected() -> None:
    """A faster candidate whose quality is 50% worse: rejected at the first look, not run on."""
    full = values(0.8, 12, 0.01, seed=4)
    n = 3
    result = {
        "status": "ok",
        "samples": cut(full, n),
        "checks": {"baseline": [0.10] * n, "candidate": [0.15] * n},
        "stopped": {"blocks": n, "decision": "gate"},
    }
    judged = judge_command(result, spec(check=GATE))
    assert judged["verdict"] == "rejected_accuracy"
    assert judged["stopped"]["decision"] == "gate" and judged["stopped"]["blocks_saved"] == 9


def test_a_gate_stop_claimed_where_the_gate_passes_is_refused() -> None:
    full = values(1.0, 12, 0.05, seed=6)
    n = 3
    result = {
        "status": "ok",
        "samples": cut(full, n),
        "checks": {"baseline": [0.10] * n, "candidate": [0.101] * n},
        "stopped": {"blocks": n, "decision": "gate"},
    }
    with pytest.raises(Unjudgeable, match="does not support that stop|says it stopped"):
        judge_command(result, spec(check=GATE))
