"""Factorial lever studies: every combination measured, beside the two null predictions.

Solo speed-ups mask each other: two levers that each save 20% of one shared stage do not
give 1.2 x 1.2. So each combination is reported with the product of its solo speed-ups
(levers independent, acting on the whole time) and an isolated-stage Amdahl estimate
(each lever only shortens its own disjoint stage, so the time saved adds up).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from typing import Any

from autopilot_harness.stats import RatioEstimate


def combinations(levers: list[str]) -> list[frozenset[str]]:
    """All 2^k subsets, the empty one (the baseline) first, then by size."""
    out: list[frozenset[str]] = []
    for size in range(len(levers) + 1):
        out += [frozenset(c) for c in itertools.combinations(levers, size)]
    return out


def label(combo: Iterable[str]) -> str:
    names = sorted(combo)
    return "+".join(names) if names else "baseline"


def product_prediction(solo_speedups: Iterable[float]) -> float:
    return math.prod(solo_speedups)


def amdahl_prediction(solo_speedups: Iterable[float]) -> float | None:
    """Speed-up if each lever's saved fraction (1 - 1/s) came from its own stage.

    None when the saved fractions add up to the whole run time or more: the isolated-stage
    model then cannot hold, which is itself a finding.
    """
    saved = sum(1.0 - 1.0 / s for s in solo_speedups)
    remaining = 1.0 - saved
    return 1.0 / remaining if remaining > 0 else None


def summarise(
    levers: list[str], estimates: Mapping[frozenset[str], RatioEstimate]
) -> dict[str, Any]:
    """Speed-ups (baseline time / combination time) with the null predictions per combination."""
    solo = {lever: 1.0 / estimates[frozenset([lever])].ratio for lever in levers}
    rows = []
    for combo in combinations(levers):
        if not combo:
            continue
        est = estimates[combo]
        speedups = [solo[lever] for lever in sorted(combo)]
        measured = 1.0 / est.ratio
        product = product_prediction(speedups)
        rows.append(
            {
                "levers": sorted(combo),
                "label": label(combo),
                "ratio": est.ratio,
                "ci_low": est.ci_low,
                "ci_high": est.ci_high,
                "speedup": measured,
                "speedup_ci": [1.0 / est.ci_high, 1.0 / est.ci_low],
                "product_of_solo": product,
                "amdahl_isolated": amdahl_prediction(speedups),
                "interaction": measured / product,
            }
        )
    return {"levers": levers, "solo_speedups": solo, "combinations": rows}
