"""Factorial design and its two null predictions."""

import pytest
from autopilot_harness import factorial
from autopilot_harness.stats import RatioEstimate


def test_combinations_cover_every_subset_baseline_first():
    combos = factorial.combinations(["a", "b", "c"])
    assert len(combos) == 8
    assert len(set(combos)) == 8
    assert combos[0] == frozenset()
    assert factorial.label(frozenset({"b", "a"})) == "a+b"


def test_null_predictions():
    assert factorial.product_prediction([1.25, 1.25]) == pytest.approx(1.5625)
    # each saves 20% of the run in its own stage: 40% saved in all
    assert factorial.amdahl_prediction([1.25, 1.25]) == pytest.approx(1 / 0.6)
    assert factorial.amdahl_prediction([2.0, 2.0]) is None  # would save the whole run


def test_summarise_sets_measured_beside_predictions():
    est = {
        frozenset({"x"}): RatioEstimate(0.8, 0.78, 0.82, 20),
        frozenset({"y"}): RatioEstimate(0.5, 0.48, 0.52, 20),
        frozenset({"x", "y"}): RatioEstimate(0.5, 0.49, 0.51, 20),
    }
    out = factorial.summarise(["x", "y"], est)
    both = next(r for r in out["combinations"] if r["label"] == "x+y")
    assert both["speedup"] == pytest.approx(2.0)
    assert both["product_of_solo"] == pytest.approx(2.5)
    assert both["interaction"] == pytest.approx(0.8)  # the levers mask each other
    assert both["amdahl_isolated"] == pytest.approx(1 / 0.3)  # 20% + 50% of the run saved
