"""The keep rule of a research line (app/cycles/judge/keep.py): each reason a step is discarded,
the choice among parallel confirmed steps, the error budget's arithmetic, and the false-keep
rate of null steps measured through the real stopping rule, the judge's check of its stop and
the keep rule, against the stated bound (with a naive keep-on-one-win rule failing the same
check, so that it can fail)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any, get_args

import numpy as np
import pytest
from autopilot_harness import sequential, stats

from app.cycles.judge import keep
from app.cycles.judge.command import judge_command
from app.cycles.judge.keep import Comparison, Discard, ErrorBudget, Keep, KeepError, Step
from app.cycles.judge.sequential import judge_stop

WIN = Comparison(
    verdict="faster",
    ratio=0.90,
    ci_low=0.86,
    ci_high=0.94,
    floor=0.02,
    metric_source="wall",
    seed=11,
    blocks=6,
    decision="effect",
)
CONFIRMED = replace(WIN, ratio=0.91, ci_low=0.87, ci_high=0.95, seed=12, blocks=5)


def discarded(outcome: keep.Outcome, reason: str) -> str:
    assert isinstance(outcome, Discard), outcome
    assert outcome.reason == reason, outcome
    assert not outcome.kept
    return outcome.sentence


# -- each reason ------------------------------------------------------------------------------


def test_a_trusted_win_confirmed_on_fresh_blocks_is_kept() -> None:
    assert keep.needs_confirmation(WIN)
    outcome = keep.decide(WIN, CONFIRMED)
    assert isinstance(outcome, Keep) and outcome.kept
    assert "seed 11" in outcome.sentence and "seed 12" in outcome.sentence


def test_a_loss_is_discarded_without_a_confirmation() -> None:
    loss = replace(WIN, verdict="slower", ratio=1.1, ci_low=1.05, ci_high=1.15)
    assert not keep.needs_confirmation(loss)
    assert "worse" in discarded(keep.decide(loss), "loss")


@pytest.mark.parametrize(
    ("decision", "words"),
    [("equivalent", "equivalence margin"), ("max", "maximum of blocks"), (None, "no change")],
)
def test_an_inconclusive_step_is_a_null(decision: str | None, words: str) -> None:
    null = replace(WIN, verdict="inconclusive", ratio=0.99, ci_low=0.97, ci_high=1.01)
    assert words in discarded(keep.decide(replace(null, decision=decision)), "null")


def test_a_failed_quality_gate_comes_before_the_speed() -> None:
    rejected = replace(WIN, verdict="rejected_accuracy", gate_passed=False)
    assert "quality gate" in discarded(keep.decide(rejected, CONFIRMED), "gate_failed")


def test_a_self_reported_win_is_never_kept_even_with_a_confirming_run() -> None:
    own = replace(WIN, trusted=False, self_reported=True, metric_source="output")
    assert not keep.needs_confirmation(own)
    for confirmation in (None, CONFIRMED, replace(own, seed=12)):
        assert "metric_source" in discarded(keep.decide(own, confirmation), "self_reported")
    # A gate read from the changed code's output is no gate either.
    own_gate = replace(WIN, trusted=False)
    assert "quality gate" in discarded(keep.decide(own_gate, CONFIRMED), "self_reported")


def test_a_verdict_whose_figures_do_not_clear_the_floor_is_not_taken() -> None:
    inside = replace(WIN, ratio=0.985, ci_low=0.97, ci_high=0.99, floor=0.02)
    assert "A/A floor" in discarded(keep.decide(inside, CONFIRMED), "null")
    touches = replace(WIN, ci_high=1.0)
    discarded(keep.decide(touches, CONFIRMED), "null")


@pytest.mark.parametrize(
    "confirmation",
    [
        replace(CONFIRMED, verdict="slower", ratio=1.04, ci_low=1.01, ci_high=1.07),
        replace(CONFIRMED, verdict="inconclusive", ratio=0.97, ci_low=0.93, ci_high=1.01),
        replace(CONFIRMED, verdict="rejected_accuracy", gate_passed=False),
    ],
    ids=["loss", "null", "gate"],
)
def test_a_confirmation_that_does_not_win_discards(confirmation: Comparison) -> None:
    sentence = discarded(keep.decide(WIN, confirmation), "confirmation_failed")
    assert "seed 11" in sentence and "seed 12" in sentence


def test_the_rule_refuses_what_it_must_not_answer() -> None:
    with pytest.raises(KeepError, match="confirmation"):
        keep.decide(WIN)
    with pytest.raises(KeepError, match="own seed 11"):
        keep.decide(WIN, replace(CONFIRMED, seed=11))
    with pytest.raises(KeepError, match="budget"):
        keep.decide(replace(WIN, alpha=0.1), CONFIRMED)
    with pytest.raises(KeepError, match="budget"):
        keep.decide(WIN, CONFIRMED, budget=ErrorBudget(0.01))


def test_the_verdict_words_are_the_judges() -> None:
    words = set(get_args(stats.Verdict))
    assert {keep._INCONCLUSIVE, keep._REJECTED} <= words
    assert set(keep.REASONS) == {
        "loss",
        "null",
        "gate_failed",
        "self_reported",
        "confirmation_failed",
        "superseded",
    }


# -- parallel steps from one tip --------------------------------------------------------------


def parallel() -> list[Step]:
    def step(name: str, seed: int, ci_high: float, **over: Any) -> Step:
        confirmation = replace(CONFIRMED, seed=seed + 1, ratio=ci_high - 0.04, ci_high=ci_high)
        return Step(name, replace(WIN, seed=seed, **over), confirmation)

    return [
        step("small", 20, 0.97),
        step("large", 30, 0.92),
        step("middle", 40, 0.95),
        Step("loser", replace(WIN, verdict="slower", ratio=1.1, ci_low=1.05, ci_high=1.15)),
    ]


def test_the_largest_confirmed_improvement_advances_the_line_the_others_are_superseded() -> None:
    outcomes = keep.settle(parallel())
    assert isinstance(outcomes["large"], Keep)
    assert "large advances the line" in outcomes["large"].sentence
    assert "ratio 0.8800, at least 8.00%" in outcomes["large"].sentence  # 1 - 0.92: its bound
    for name in ("small", "middle"):
        assert "large from the same tip measured more" in discarded(outcomes[name], "superseded")
    discarded(outcomes["loser"], "loss")


def test_best_of_takes_only_confirmed_keeps() -> None:
    steps = parallel()
    choice = keep.best_of(steps[:3])
    assert choice.chosen == "large" and set(choice.superseded) == {"small", "middle"}
    with pytest.raises(KeepError, match="loser"):
        keep.best_of(steps)
    single = keep.best_of(steps[:1])
    assert single.chosen == "small" and not single.superseded


def test_a_higher_is_better_metric_is_kept_by_its_lower_bound() -> None:
    up = replace(WIN, verdict="better", direction="higher", ratio=1.1, ci_low=1.05, ci_high=1.15)
    steps = [
        Step("a", up, replace(up, seed=2, ci_low=1.03)),
        Step("b", replace(up, seed=3), replace(up, seed=4, ci_low=1.06)),
    ]
    assert keep.best_of(steps).chosen == "b"


# -- from the judge's own output --------------------------------------------------------------


def command_result(factor: float, seed: int, changed: bool = True) -> dict[str, Any]:
    rng = random.Random(seed)
    return {
        "status": "ok",
        "samples": {
            "baseline": [10 * (1 + rng.gauss(0, 0.01)) for _ in range(12)],
            "candidate": [10 * factor * (1 + rng.gauss(0, 0.01)) for _ in range(12)],
            "baseline_aa": [10 * (1 + rng.gauss(0, 0.01)) for _ in range(12)],
        },
        "arms": {
            "baseline": {"commit": "a" * 40},
            "candidate": {"commit": "b" * 40 if changed else "a" * 40},
        },  # fmt: skip
    }


def spec(source: str, seed: int, **over: Any) -> dict[str, Any]:
    return {
        "kind": "command",
        "metric": "step_ms",
        "direction": "lower",
        "time_metric": True,
        "check": None,
        "metric_source": source,
        "seed": seed,
        **over,
    }


def test_the_judges_output_is_read_and_a_self_reported_win_stays_discarded() -> None:
    judged = judge_command(command_result(0.8, 1), spec("output", 1))
    assert judged["verdict"] == "faster" and judged["self_reported"] is True
    again = judge_command(command_result(0.8, 2), spec("output", 2))
    own = Comparison.from_judged(judged)
    assert own.metric_source == "output" and own.seed == 1 and own.alpha == keep.FIXED_ALPHA
    discarded(keep.decide(own, Comparison.from_judged(again)), "self_reported")

    rule = sequential.Rule(max_blocks=12)
    result = command_result(0.8, 3)
    values = result["samples"]
    stop = sequential.first_stop(
        rule, values["baseline"], values["candidate"], values["baseline_aa"], seed=3
    )
    assert stop is not None and stop.decision == "effect"
    result["samples"] = {role: v[: stop.blocks] for role, v in values.items()}
    result["stopped"] = {"blocks": stop.blocks, "decision": stop.decision}
    trusted = judge_command(result, spec("wall", 3, sequential=rule.as_dict()))
    seen = Comparison.from_judged(trusted)
    assert seen.trusted and seen.decision == "effect" and seen.blocks == trusted["n"]
    assert seen.floor == trusted["noise_floor"]["floor"]


def test_a_judged_result_without_figures_cannot_be_kept() -> None:
    with pytest.raises(KeepError, match="ratio"):
        Comparison.from_judged({"verdict": "faster", "ratio": None})
    with pytest.raises(KeepError, match="never judged"):
        Comparison.from_judged({"status": "error"})


# -- the error budget -------------------------------------------------------------------------


def test_the_budget_at_the_rules_default_level() -> None:
    budget = ErrorBudget()
    assert budget.alpha == sequential.DEFAULT_ALPHA
    assert budget.per_step == pytest.approx(0.025**2)
    assert budget.expected_false_keeps(40) == pytest.approx(0.025)
    tail = budget.chance_of_more_than(2, 40)
    assert 2.3e-6 < tail < 2.4e-6
    naive = keep.binomial_tail(40, 0.025, 3)  # one win, no confirmation
    assert 0.07 < naive < 0.08
    assert keep.binomial_tail(10_000, 0.5, 0) == 1.0
    assert 0.49 < keep.binomial_tail(10_000, 0.5, 5_001) < 0.5


def test_a_longer_campaign_gets_a_lower_level() -> None:
    assert ErrorBudget.for_campaign(40, 2, 1e-3) == ErrorBudget()  # the default suffices
    tight = ErrorBudget.for_campaign(2_000, 2, 1e-3)
    assert tight.alpha < sequential.DEFAULT_ALPHA
    assert tight.chance_of_more_than(2, 2_000) <= 1e-3
    assert ErrorBudget(tight.alpha * 1.01).chance_of_more_than(2, 2_000) > 1e-3
    with pytest.raises(KeepError):
        ErrorBudget.for_campaign(0, 2, 0.01)


# -- measured: false keeps of null steps ------------------------------------------------------

#: A level high enough that 10,000 null steps can measure the bound ((0.2 / 2)**2 = 0.01, 100
#: false keeps at the bound); at the default 0.05 the bound, 0.000625, would be ~6 keeps.
ALPHA = 0.2
NULL_STEPS = 10_000
RULE = sequential.Rule(max_blocks=5, alpha=ALPHA)


def null_blocks(rng: np.random.Generator) -> dict[str, list[float]]:
    """RULE.max_blocks blocks with no effect: a drift the block's three runs share, within-run
    noise of CV 3%, and 2% of runs in a slow spell 1.2-1.6x longer."""
    n = RULE.max_blocks
    drift = np.exp(0.05 * rng.standard_normal(n))
    runs = 100.0 * drift * np.exp(0.03 * rng.standard_normal((3, n)))
    runs *= np.where(rng.random((3, n)) < 0.02, rng.uniform(1.2, 1.6, (3, n)), 1.0)
    return dict(zip(("baseline", "candidate", "baseline_aa"), runs.tolist(), strict=True))


def judged(values: dict[str, list[float]], seed: int) -> Comparison:
    """Where the runner's rule stops; where it stops on an effect (the only stop whose verdict
    can be a win), the judge's check of that stop and its verdict. Any other stop (equivalent,
    the maximum) the judge calls `inconclusive`: asking it there too would double the time."""
    stop = sequential.first_stop(
        RULE, values["baseline"], values["candidate"], values["baseline_aa"], seed=seed
    )
    assert stop is not None
    seen: dict[str, Any] = {**stop.as_dict(), "verdict": "inconclusive"}
    if stop.decision == "effect":
        cut = {role: v[: stop.blocks] for role, v in values.items()}
        seen = judge_stop(RULE, cut, {"decision": stop.decision}, seed)
    return Comparison(
        verdict=seen["verdict"],
        ratio=seen["ratio"],
        ci_low=seen["ci_low"],
        ci_high=seen["ci_high"],
        floor=seen["floor"],
        metric_source="wall",
        seed=seed,
        blocks=seen["blocks"],
        decision=seen["decision"],
        alpha=RULE.alpha,
    )


def wilson(hits: int, n: int, z: float = 2.576) -> tuple[float, float]:
    """The Wilson score interval of a proportion (99% at z = 2.576)."""
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@pytest.mark.slow
def test_null_steps_are_kept_no_more_often_than_the_bound_and_one_win_is_not_enough() -> None:
    budget = ErrorBudget(ALPHA)
    rng = np.random.default_rng(20261206)
    kept = naive = 0
    for i in range(NULL_STEPS):
        step = judged(null_blocks(rng), seed=2 * i + 1)
        confirmation = None
        if keep.needs_confirmation(step):
            naive += 1  # the naive rule keeps on this one win
            confirmation = judged(null_blocks(rng), seed=2 * i + 2)
        kept += keep.decide(step, confirmation, budget=budget).kept
    assert wilson(kept, NULL_STEPS)[1] <= budget.per_step, (kept, naive)
    assert wilson(naive, NULL_STEPS)[0] > budget.per_step, (kept, naive)


def test_a_larger_measured_gain_wins_over_a_bound_just_past_one() -> None:
    """A sequential confirmation stops as soon as its interval clears 1, so the bounds of two
    real wins both sit just past 1: the measured ratio decides, the bound only breaks ties."""
    big = replace(CONFIRMED, seed=31, ratio=0.55, ci_low=0.40, ci_high=0.99)
    small = replace(CONFIRMED, seed=41, ratio=0.80, ci_low=0.76, ci_high=0.98)
    steps = [Step("big", replace(WIN, seed=30), big), Step("small", replace(WIN, seed=40), small)]
    assert keep.best_of(steps).chosen == "big"
