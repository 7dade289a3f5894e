"""Paired-ratio statistics: CI coverage, A/A behaviour, verdict rules."""

import numpy as np
import pytest
from autopilot_harness import stats
from hypothesis import given
from hypothesis import strategies as st


def synthetic_pairs(rng, n, true_ratio, sigma=0.1):
    """A's base time with per-call noise; B = A's base x true_ratio x its own noise.

    The noise is log-symmetric, so the median of B/A is exactly true_ratio.
    """
    base = rng.uniform(1e6, 2e6, size=n)
    a = base * rng.lognormal(0.0, sigma, size=n)
    b = base * true_ratio * rng.lognormal(0.0, sigma, size=n)
    return a, b


def test_bootstrap_ci_covers_true_ratio_at_about_nominal_rate():
    true_ratio = 1.05
    seeds = 400
    covered = 0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        a, b = synthetic_pairs(rng, 41, true_ratio)
        est = stats.estimate_ratio(a, b, seed=seed, n_boot=1000)
        covered += est.ci_low <= true_ratio <= est.ci_high
    coverage = covered / seeds
    assert 0.90 <= coverage <= 0.99, coverage


def test_ci_narrows_with_more_pairs():
    rng = np.random.default_rng(1)
    small = stats.estimate_ratio(*synthetic_pairs(rng, 20, 1.0))
    large = stats.estimate_ratio(*synthetic_pairs(rng, 500, 1.0))
    assert (large.ci_high - large.ci_low) < 0.5 * (small.ci_high - small.ci_low)


def test_a_a_comparison_is_inconclusive():
    verdicts = []
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        floor = stats.noise_floor(stats.estimate_ratio(*synthetic_pairs(rng, 40, 1.0), seed=seed))
        est = stats.estimate_ratio(*synthetic_pairs(rng, 40, 1.0), seed=seed + 1)
        verdicts.append(stats.decide(est, floor, accuracy_pass=True))
    inconclusive = verdicts.count("inconclusive") / len(verdicts)
    assert inconclusive >= 0.97, inconclusive


@pytest.mark.parametrize(("true_ratio", "expected"), [(1.10, "slower"), (0.90, "faster")])
def test_clear_effect_gets_a_direction(true_ratio, expected):
    rng = np.random.default_rng(3)
    floor = stats.noise_floor(stats.estimate_ratio(*synthetic_pairs(rng, 60, 1.0, sigma=0.02)))
    est = stats.estimate_ratio(*synthetic_pairs(rng, 60, true_ratio, sigma=0.02))
    assert stats.decide(est, floor, accuracy_pass=True) == expected


def test_effect_inside_noise_floor_is_inconclusive():
    est = stats.RatioEstimate(ratio=0.97, ci_low=0.96, ci_high=0.98, n=30)
    assert stats.decide(est, 0.04, accuracy_pass=True) == "inconclusive"
    assert stats.decide(est, 0.01, accuracy_pass=True) == "faster"


def test_ci_crossing_one_is_inconclusive():
    est = stats.RatioEstimate(ratio=0.90, ci_low=0.80, ci_high=1.01, n=30)
    assert stats.decide(est, 0.0, accuracy_pass=True) == "inconclusive"


@given(
    ratio=st.floats(0.01, 100.0),
    spread=st.floats(0.0, 0.5),
    floor=st.floats(0.0, 1.0),
)
def test_variant_outside_tolerance_is_never_faster(ratio, spread, floor):
    est = stats.RatioEstimate(ratio, ratio * (1 - spread), ratio * (1 + spread), 30)
    assert stats.decide(est, floor, accuracy_pass=False) == "rejected_accuracy"


def test_noise_floor_is_the_widest_reach_from_one():
    est = stats.RatioEstimate(ratio=1.002, ci_low=0.985, ci_high=1.01, n=30)
    assert stats.noise_floor(est) == pytest.approx(0.015)


@pytest.mark.parametrize(
    ("a", "b"),
    [([1.0, 2.0], [1.0]), ([1.0], [1.0]), ([1.0, 0.0], [1.0, 1.0]), ([1.0, 2.0], [1.0, -1.0])],
)
def test_paired_ratios_rejects_bad_samples(a, b):
    with pytest.raises(ValueError, match=r"."):
        stats.paired_ratios(a, b)
