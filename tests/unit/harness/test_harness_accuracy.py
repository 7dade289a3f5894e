"""Accuracy gate: relative to the output's magnitude, with an absolute floor."""

import math

import numpy as np
import pytest
import torch
from autopilot_harness import accuracy, stats
from autopilot_harness.protocol import Tolerance

TOL = Tolerance(rtol=1e-4, atol=1e-6)


def large_operands(seed):
    gen = torch.Generator().manual_seed(seed)
    magnitude = 10.0 ** (3 + 3 * torch.rand(3, generator=gen))  # 1e3 .. 1e6 per operand
    x = torch.randn(48, 64, generator=gen) * magnitude[0]
    b = torch.randn(64, 8, generator=gen) * magnitude[1]
    a = torch.randn(8, 64, generator=gen) * magnitude[2]
    return x, b, a


def test_relative_tolerance_holds_on_large_magnitude_operands_over_200_seeds():
    worst = 0.0
    for seed in range(200):
        x, b, a = large_operands(seed)
        reference = x.double() @ (b.double() @ a.double())
        for output in ((x @ b) @ a, x @ (b @ a)):  # float32, two associations
            acc = accuracy.check(output, reference, TOL)
            assert acc.passed, (seed, acc)
            worst = max(worst, acc.max_abs_error)
    # the same errors would fail any plain absolute tolerance: the gate must be relative
    assert worst > 1e3


def test_wrong_answer_on_large_operands_is_rejected_over_200_seeds():
    for seed in range(200):
        x, b, a = large_operands(seed)
        reference = x.double() @ (b.double() @ a.double())
        wrong = (x @ b) @ a
        wrong[seed % wrong.shape[0], 0] += 1e-3 * reference.abs().max().float()
        assert not accuracy.check(wrong, reference, TOL).passed, seed


def test_a_fast_variant_outside_tolerance_is_never_faster():
    x, b, a = large_operands(0)
    reference = x.double() @ (b.double() @ a.double())
    acc = accuracy.check(((x @ b) @ a) * 1.01, reference, TOL)
    fast = stats.RatioEstimate(ratio=0.5, ci_low=0.49, ci_high=0.51, n=50)
    assert stats.decide(fast, 0.0, accuracy_pass=acc.passed) == "rejected_accuracy"


def test_absolute_floor_covers_an_all_zero_reference():
    ref = np.zeros(10)
    assert accuracy.check(ref + 1e-7, ref, TOL).passed
    assert not accuracy.check(ref + 1e-5, ref, TOL).passed


def test_complex_outputs_compare_in_complex128():
    ref = torch.randn(16, dtype=torch.complex128)
    assert accuracy.check(ref.to(torch.complex64), ref, TOL).passed
    assert not accuracy.check(ref.conj().to(torch.complex64), ref, TOL).passed


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_output_fails(bad):
    out = torch.ones(4)
    out[2] = bad
    acc = accuracy.check(out, torch.ones(4), TOL)
    assert not acc.passed
    assert "non-finite" in acc.reason
    assert acc.as_dict()["max_abs_error"] is None  # stays valid JSON


def test_shape_mismatch_fails():
    acc = accuracy.check(torch.ones(3, 4), torch.ones(4, 3), TOL)
    assert not acc.passed
    assert "shape" in acc.reason
