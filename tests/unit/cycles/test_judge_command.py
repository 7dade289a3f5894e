"""The control plane's verdict on a command experiment, from every run's value
(app/cycles/judge/command.py)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.cycles.exceptions import Unjudgeable
from app.cycles.judge.command import judge_command


def result(
    candidate_factor: float, *, n: int = 8, noise: float = 0.005, seed: int = 0
) -> dict[str, Any]:
    rng = random.Random(seed)

    def run(base: float) -> float:
        return base * (1 + rng.gauss(0, noise))

    return {
        "status": "ok",
        "kind": "command",
        "samples": {
            "baseline": [run(10.0) for _ in range(n)],
            "candidate": [run(10.0 * candidate_factor) for _ in range(n)],
            "baseline_aa": [run(10.0) for _ in range(n)],
        },
        "checks": {"baseline": [0.50] * n, "candidate": [0.505] * n},
    }


def spec(**over: Any) -> dict[str, Any]:
    return {
        "seed": 0,
        "kind": "command",
        "metric": "step_ms",
        "direction": "lower",
        "time_metric": True,
        "check": None,
        **over,
    }


def test_doubled_work_is_slower_with_a_ci_above_one() -> None:
    judged = judge_command(result(2.0), spec())
    assert judged["verdict"] == "slower"
    assert 1.9 < judged["ci_low"] <= judged["ratio"] <= judged["ci_high"] < 2.1
    assert judged["headline"]["verdict"] == "slower" and judged["headline"]["noise_floor"] >= 0
    assert judged["judgement"]["by"] == "control-plane"


def test_a_higher_is_better_metric_that_is_not_a_time_is_better_or_worse() -> None:
    assert (
        judge_command(result(1.5), spec(direction="higher", time_metric=False))["verdict"]
        == "better"
    )
    assert (
        judge_command(result(0.6), spec(direction="higher", time_metric=False))["verdict"]
        == "worse"
    )
    assert judge_command(result(0.6), spec(time_metric=False))["verdict"] == "better"
    assert judge_command(result(0.6), spec())["verdict"] == "faster"


def test_the_same_program_twice_is_inconclusive() -> None:
    assert judge_command(result(1.0), spec())["verdict"] == "inconclusive"


def test_the_check_gate_comes_first() -> None:
    gated = spec(check={"direction": "lower", "tolerance": 0.02})
    passed = judge_command(result(0.5), gated)
    assert passed["verdict"] == "faster" and passed["check"]["pass"] is True
    worse = result(0.5)
    worse["checks"]["candidate"] = [0.6] * 8
    judged = judge_command(worse, gated)
    assert judged["verdict"] == "rejected_accuracy" and judged["headline"]["accuracy_pass"] is False
    assert (
        "0.6 is worse than the baseline's 0.5 beyond the 0.02 relative tolerance"
        in judged["check"]["reason"]
    )
    # within the tolerance in the other direction: a higher-is-better check
    judged = judge_command(worse, spec(check={"direction": "higher", "tolerance": 0.0}))
    assert judged["check"]["pass"] is True


def test_the_spec_not_the_result_says_how_to_judge() -> None:
    forged = result(2.0)
    forged["direction"] = "higher"  # the result's own copy is never read
    assert judge_command(forged, spec())["verdict"] == "slower"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("samples"), "samples is missing"),
        (lambda r: r["samples"]["candidate"].pop(), "each block has one run of each"),
        (lambda r: r["samples"]["baseline"].__setitem__(0, -1.0), "ratios need positive values"),
        (lambda r: r["samples"]["baseline"].__setitem__(0, "x"), "is not a number"),
        (lambda r: r["samples"].__setitem__("baseline_aa", [1.0]), "needs 2"),
    ],
)
def test_a_malformed_result_is_unjudgeable(mutate: Any, message: str) -> None:
    bad = result(1.0)
    mutate(bad)
    with pytest.raises(Unjudgeable, match=message):
        judge_command(bad, spec())


def test_a_missing_check_when_the_spec_gates_is_unjudgeable() -> None:
    bad = result(1.0)
    bad.pop("checks")
    with pytest.raises(Unjudgeable, match="checks is missing"):
        judge_command(bad, spec(check={"direction": "lower", "tolerance": 0.0}))
