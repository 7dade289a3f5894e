"""The stopping rule's error rates under continuous looks, measured on simulated sequences, and
a naive rule measured the same way (so that the check can fail)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from autopilot_harness import sequential
from autopilot_harness.sequential import Rule, RuleError

SEQUENCES = 10_000


def null_draws(kind: str, rows: int, cols: int, seed: int) -> np.ndarray:
    """Paired log ratios under no effect: symmetric about 0, as exchangeable arms give."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal((rows, cols))
    if kind == "laplace":
        return rng.laplace(size=(rows, cols))
    if kind == "student_t3":
        return rng.standard_t(3, size=(rows, cols))
    # the difference of two log-normal runs' logs with a slow drift both arms share
    base = rng.lognormal(0.0, 0.5, size=(rows, cols)) + np.linspace(0, 1, cols)
    cand = rng.lognormal(0.0, 0.5, size=(rows, cols)) + np.linspace(0, 1, cols)
    return np.log(cand) - np.log(base)


def crossing_rate(d: np.ndarray, min_blocks: int, cuts: np.ndarray) -> float:
    """Share of sequences whose |t| reaches the cut at any look from `min_blocks` on."""
    abs_t = np.abs(sequential.t_path(d)[:, min_blocks - 1 :])
    return float(np.mean(np.any(abs_t >= cuts, axis=1)))


@pytest.mark.parametrize("max_blocks", [5, 10, 20, 40])
@pytest.mark.parametrize("kind", ["normal", "laplace", "student_t3", "drifting_lognormal"])
def test_false_positives_under_every_look_stay_within_alpha(kind: str, max_blocks: int) -> None:
    rule = Rule(max_blocks=max_blocks)
    cuts = np.array([rule.boundary(n) for n in range(rule.min_blocks, max_blocks + 1)])
    rate = crossing_rate(null_draws(kind, SEQUENCES, max_blocks, seed=7 + max_blocks), 3, cuts)
    assert rate <= rule.alpha, (kind, max_blocks, rate)


@pytest.mark.parametrize("max_blocks", [10, 20])
def test_a_naive_rule_that_stops_when_a_95_percent_interval_excludes_1_fails_the_same_check(
    max_blocks: int,
) -> None:
    """Each look's own 5% cut (the 0.95 quantile of the null |t| at that look, as a fixed 95%
    interval would use), looked at after every block: the same check fails."""
    calibration = np.abs(sequential.t_path(null_draws("normal", 100_000, max_blocks, seed=1)))
    naive = np.quantile(calibration[:, 2:], 0.95, axis=0)
    rate = crossing_rate(null_draws("normal", SEQUENCES, max_blocks, seed=2), 3, naive)
    assert rate > 2 * 0.05, rate  # measured: 0.17 at 10 looks, 0.23 at 20


def test_the_boundary_is_one_nominal_level_and_tighter_than_a_single_look() -> None:
    rule = Rule(max_blocks=20)
    cuts = [rule.boundary(n) for n in range(3, 21)]
    assert all(a > b for a, b in zip(cuts, cuts[1:], strict=False))  # fewer df, larger cut
    assert cuts[-1] > 2.09  # a single look at 20 blocks cuts at t(19) 0.975 = 2.09
    assert sequential.boundaries(3, 20, 0.05) == sequential.boundaries(3, 20, 0.05)


def blocks(effect: float, noise: float, n: int, seed: int) -> tuple[list[float], ...]:
    """`n` blocks of a time metric: the candidate `effect` slower, each run with `noise`."""
    rng = np.random.default_rng(seed)
    base = 100.0 * np.exp(noise * rng.standard_normal(n))
    aa = 100.0 * np.exp(noise * rng.standard_normal(n))
    cand = 100.0 * (1 + effect) * np.exp(noise * rng.standard_normal(n))
    return list(base), list(cand), list(aa)


def test_a_large_effect_stops_at_the_first_looks() -> None:
    rule = Rule(max_blocks=20)
    stops = []
    for seed in range(50):
        base, cand, aa = blocks(0.30, 0.02, 20, seed)
        stop = sequential.first_stop(rule, base, cand, aa, seed=seed)
        assert stop is not None and stop.decision == "effect" and stop.ratio > 1.2, stop
        stops.append(stop.blocks)
    assert float(np.mean(stops)) <= 4.0, stops


def test_a_five_percent_effect_is_found_in_fewer_blocks_than_the_maximum() -> None:
    rule = Rule(max_blocks=20)
    found, used = 0, []
    for seed in range(100):
        base, cand, aa = blocks(0.05, 0.02, 20, seed)
        stop = sequential.first_stop(rule, base, cand, aa, seed=seed)
        assert stop is not None
        found += stop.decision == "effect" and stop.ratio > 1
        used.append(stop.blocks)
    assert found >= 90, found
    assert float(np.mean(used)) <= 10, used


def test_no_effect_on_a_quiet_machine_stops_as_equivalent_and_rarely_claims_one() -> None:
    rule = Rule(max_blocks=20, margin=0.02)
    decisions = []
    for seed in range(100):
        base, cand, aa = blocks(0.0, 0.005, 20, seed)
        stop = sequential.first_stop(rule, base, cand, aa, seed=seed)
        assert stop is not None
        decisions.append((stop.decision, stop.blocks))
    assert sum(d == "equivalent" for d, _ in decisions) >= 90, decisions
    assert sum(d == "effect" for d, _ in decisions) <= 5, decisions
    assert float(np.mean([n for _, n in decisions])) < 10, decisions


def test_equivalence_is_wrongly_claimed_at_the_margin_no_more_than_alpha() -> None:
    """A change exactly the size of the margin: the repeated interval covers it at every look
    with chance >= 1 - alpha, so it is called equivalent with chance <= alpha."""
    rule = Rule(max_blocks=20, margin=0.02)
    d = math.log1p(0.02) + 0.01 * null_draws("normal", SEQUENCES, 20, seed=3)
    cuts = np.array([rule.boundary(n) for n in range(3, 21)])
    n = np.arange(1, 21, dtype=np.float64)
    mean = np.cumsum(d, axis=1) / n
    sd = np.sqrt(np.maximum((np.cumsum(d * d, axis=1) - n * mean**2) / np.maximum(n - 1, 1), 0))
    reach = np.abs(mean[:, 2:]) + sd[:, 2:] / np.sqrt(n[2:]) * cuts
    wrongly = float(np.mean(np.any(reach < math.log1p(0.02), axis=1)))
    assert wrongly <= rule.alpha, wrongly


def test_it_goes_on_until_the_maximum_and_then_says_so() -> None:
    rule = Rule(max_blocks=6)
    base, cand, aa = blocks(0.01, 0.05, 6, seed=11)  # too small to see, too noisy to rule out
    assert sequential.first_stop(rule, base[:5], cand[:5], aa[:5], seed=1) is None
    last = sequential.first_stop(rule, base, cand, aa, seed=1)
    assert last is not None and last.decision == "max" and last.blocks == 6


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"max_blocks": 2}, "min_blocks <= max_blocks"),
        ({"max_blocks": 10, "min_blocks": 11}, "min_blocks=11"),
        ({"max_blocks": 10, "alpha": 0.6}, "alpha must lie in"),
        ({"max_blocks": 10, "margin": 0.0}, "margin"),
    ],
)
def test_a_rule_with_unusable_parameters_says_which(kwargs: dict, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(RuleError, match=words):
        Rule(**kwargs)


def test_a_look_refuses_unequal_blocks_and_a_look_past_the_maximum() -> None:
    rule = Rule(max_blocks=4)
    with pytest.raises(RuleError, match="one value of each role"):
        sequential.look(rule, [1.0, 1.0, 1.0], [1.0, 1.0], [1.0, 1.0, 1.0], seed=0)
    with pytest.raises(RuleError, match="beyond the rule's maximum of 4"):
        sequential.look(rule, [1.0] * 5, [1.0] * 5, [1.0] * 5, seed=0)
