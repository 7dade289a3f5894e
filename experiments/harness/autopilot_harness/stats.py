"""Paired-ratio statistics: median ratio, bootstrap confidence interval, A/A noise floor, verdict.

Pure numpy so it can be tested (and reused by the service's analysis) without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Verdict = Literal["faster", "slower", "inconclusive", "rejected_accuracy"]

DEFAULT_CONFIDENCE = 0.95
DEFAULT_BOOTSTRAP = 2000


@dataclass(frozen=True)
class RatioEstimate:
    """Median of paired B/A time ratios with its bootstrap confidence interval."""

    ratio: float
    ci_low: float
    ci_high: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high, "n": self.n}


def paired_ratios(a: Sequence[float], b: Sequence[float]) -> np.ndarray:
    """B/A ratio of each pair; pairs must have equal length and positive times."""
    a_arr = np.asarray(a, dtype=np.float64)
    b_arr = np.asarray(b, dtype=np.float64)
    if a_arr.shape != b_arr.shape or a_arr.ndim != 1:
        raise ValueError(
            f"paired samples need equal 1-D shapes, got {a_arr.shape} and {b_arr.shape}"
        )
    if a_arr.size < 2:
        raise ValueError("at least two pairs are needed for a confidence interval")
    if np.any(a_arr <= 0) or np.any(b_arr <= 0):
        raise ValueError("timings must be positive")
    return b_arr / a_arr


def bootstrap_median_ci(
    values: Sequence[float] | np.ndarray,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    n_boot: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> RatioEstimate:
    """Percentile bootstrap CI of the median, resampling whole pairs (their ratios)."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or arr.size < 2:
        raise ValueError("need at least two values")
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arr.size, size=(n_boot, arr.size))
    medians = np.median(arr[idx], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(medians, [alpha, 1.0 - alpha])
    return RatioEstimate(float(np.median(arr)), float(low), float(high), int(arr.size))


def estimate_ratio(
    a: Sequence[float], b: Sequence[float], *, seed: int = 0, n_boot: int = DEFAULT_BOOTSTRAP
) -> RatioEstimate:
    return bootstrap_median_ci(paired_ratios(a, b), seed=seed, n_boot=n_boot)


def noise_floor(aa: RatioEstimate) -> float:
    """Largest relative effect that noise alone produced in the A/A comparison.

    An A/A ratio is 1 by construction; how far its median and CI reach from 1 is the size of
    effect this machine invents under the same conditions, so smaller claimed effects are noise.
    """
    return float(max(abs(aa.ratio - 1.0), 1.0 - aa.ci_low, aa.ci_high - 1.0, 0.0))


def decide(estimate: RatioEstimate, floor: float, *, accuracy_pass: bool) -> Verdict:
    """Verdict for a B/A time ratio: accuracy first, then CI, then the A/A noise floor."""
    if not accuracy_pass:
        return "rejected_accuracy"
    if estimate.ci_low <= 1.0 <= estimate.ci_high:
        return "inconclusive"
    if abs(estimate.ratio - 1.0) <= floor:
        return "inconclusive"
    return "faster" if estimate.ratio < 1.0 else "slower"
