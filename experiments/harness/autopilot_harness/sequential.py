"""A stopping rule for paired comparisons that stays valid when it is looked at after every block.

A comparison runs in blocks; each block gives one paired log ratio d = log(candidate /
baseline) (and an A/A pair, baseline against baseline, for the noise floor). Peeking at an
ordinary 95% confidence interval after every block and stopping when it excludes 1 inflates
the false-positive rate several-fold (a test below measures it near 0.2 at 20 blocks). This rule
is a group-sequential design with a known maximum, as Pocock's: after each block from
`min_blocks` to `max_blocks` the t statistic of the paired log ratios is compared with a
boundary `c_n` that is the same nominal level at every look, calibrated so that the chance of
crossing it at *any* look under no effect is `alpha` (by simulation of Gaussian paired
differences with a fixed seed; `boundaries`). So, by construction:

- **effect**: |t_n| >= c_n and the ratio clears the A/A noise floor: a win or a loss, with
  false-positive rate <= alpha however many looks were taken;
- **equivalent**: the repeated confidence interval, mean +- c_n * se, lies within
  +-log(1 + margin): the change is smaller than `margin`, wrongly so with chance <= alpha
  (the same boundary covers the centred statistic at every look at once);
- **max**: `max_blocks` were run without either: inconclusive, as a fixed design that did not
  decide.

Why it holds on real machines, not only on Gaussian draws: under no effect the arms are
exchangeable (the order inside a block is drawn at random), so each d is symmetric about 0,
and the t statistic of symmetric, heavier-tailed differences crosses a Gaussian-calibrated
boundary less often, not more (the unit tests measure it on Laplace and Student-t noise).

The runner on the GPU host stops a job with `first_stop` after each block; the control plane
calls the same function on the recorded samples and refuses a stop it does not reproduce.
Pure numpy, as `stats`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from autopilot_harness import stats

Decision = Literal["continue", "effect", "equivalent", "max"]

#: The seed of the boundary's calibration: fixed, so runner and judge compute the same boundary.
CALIBRATION_SEED = 20261205
#: Simulated sequences the boundary is calibrated on.
CALIBRATION_SEQUENCES = 200_000
#: The boundary is calibrated to this share of alpha, so that its Monte Carlo error (about 0.001
#: at 200,000 sequences) keeps the real rate under alpha.
CALIBRATION_SHARE = 0.92
#: Defaults a project may override per experiment.
DEFAULT_MIN_BLOCKS = 3
DEFAULT_ALPHA = 0.05
DEFAULT_MARGIN = 0.02
#: The largest maximum a rule accepts (its calibration grows with it).
MAX_BLOCKS_LIMIT = 200


class RuleError(ValueError):
    """A rule's parameters, or the samples it is given, are not usable."""


@dataclass(frozen=True)
class Rule:
    """When a comparison of `max_blocks` blocks at most may stop."""

    max_blocks: int
    min_blocks: int = DEFAULT_MIN_BLOCKS
    alpha: float = DEFAULT_ALPHA
    margin: float = DEFAULT_MARGIN

    def __post_init__(self) -> None:
        if not 3 <= self.min_blocks <= self.max_blocks <= MAX_BLOCKS_LIMIT:
            raise RuleError(
                f"a stopping rule needs 3 <= min_blocks <= max_blocks <= {MAX_BLOCKS_LIMIT}, "
                f"got min_blocks={self.min_blocks}, max_blocks={self.max_blocks}"
            )
        if not 0.0 < self.alpha < 0.5:
            raise RuleError(f"alpha must lie in (0, 0.5), got {self.alpha}")
        if not 0.0 < self.margin < 1.0:
            raise RuleError(f"margin (a relative change) must lie in (0, 1), got {self.margin}")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Rule:
        """The rule as `as_dict` wrote it (a job's spec holds it so)."""
        try:
            return cls(
                max_blocks=int(raw["max_blocks"]),
                min_blocks=int(raw["min_blocks"]),
                alpha=float(raw["alpha"]),
                margin=float(raw["margin"]),
            )
        except RuleError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise RuleError(
                f"a stopping rule is a table of max_blocks, min_blocks, alpha and margin; "
                f"{dict(raw)!r} is not one ({type(exc).__name__}: {exc})"
            ) from None

    def boundary(self, blocks: int) -> float:
        """The critical |t| after `blocks` blocks."""
        if not self.min_blocks <= blocks <= self.max_blocks:
            raise RuleError(
                f"no look after {blocks} blocks: looks run from {self.min_blocks} "
                f"to {self.max_blocks}"
            )
        return boundaries(self.min_blocks, self.max_blocks, self.alpha)[blocks - self.min_blocks]

    def as_dict(self) -> dict[str, float | int]:
        return {
            "min_blocks": self.min_blocks,
            "max_blocks": self.max_blocks,
            "alpha": self.alpha,
            "margin": self.margin,
        }


@dataclass(frozen=True)
class Look:
    """What the rule says after `blocks` blocks."""

    blocks: int
    decision: Decision
    ratio: float  # exp(mean log ratio): the geometric mean of the paired ratios
    ci_low: float  # the repeated confidence interval at this look
    ci_high: float
    t: float
    boundary: float
    floor: float  # the A/A noise floor at this look

    @property
    def stopped(self) -> bool:
        return self.decision != "continue"

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "blocks": self.blocks,
            "decision": self.decision,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "t": self.t,
            "boundary": self.boundary,
            "floor": self.floor,
        }


@functools.lru_cache(maxsize=64)
def boundaries(min_blocks: int, max_blocks: int, alpha: float) -> tuple[float, ...]:
    """The critical |t| at each look from `min_blocks` to `max_blocks`: the quantile of the null
    |t| at that look at one nominal level, the level chosen (by bisection) so that the chance of
    any crossing under no effect is CALIBRATION_SHARE * alpha."""
    rng = np.random.default_rng(CALIBRATION_SEED)
    draws = rng.standard_normal((CALIBRATION_SEQUENCES, max_blocks))
    abs_t = np.abs(t_path(draws)[:, min_blocks - 1 :])
    ordered = np.sort(abs_t, axis=0)
    target = CALIBRATION_SHARE * alpha
    low, high = 0.0, alpha  # the nominal per-look level lies between 0 and alpha
    cut = ordered[-1]
    for _ in range(40):
        level = (low + high) / 2
        cut = _quantiles(ordered, level)
        crossed = float(np.mean(np.any(abs_t >= cut, axis=1)))
        if crossed > target:
            high = level
        else:
            low = level
    return tuple(float(c) for c in _quantiles(ordered, low))


def _quantiles(ordered: np.ndarray, level: float) -> np.ndarray:
    """The upper `level` quantile of each column of the column-sorted `ordered`."""
    rows = ordered.shape[0]
    index = min(rows - 1, max(0, math.ceil((1.0 - level) * rows) - 1))
    return ordered[index]


def t_path(d: np.ndarray) -> np.ndarray:
    """The one-sample t statistic of each row's first n values, for every n (n = 1 gives 0)."""
    n = np.arange(1, d.shape[1] + 1, dtype=np.float64)
    total = np.cumsum(d, axis=1)
    mean = total / n
    squares = np.cumsum(d * d, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        var = (squares - n * mean * mean) / (n - 1)
        t = mean / np.sqrt(np.maximum(var, 0.0) / n)
    return np.nan_to_num(t, nan=0.0, posinf=np.inf, neginf=-np.inf)


def look(
    rule: Rule,
    baseline: Sequence[float],
    candidate: Sequence[float],
    baseline_aa: Sequence[float],
    *,
    seed: int,
) -> Look:
    """The rule's decision on the blocks so far (one value of each role per block)."""
    n = len(baseline)
    if not len(candidate) == len(baseline_aa) == n:
        raise RuleError(
            f"each block has one value of each role; got baseline {n}, candidate "
            f"{len(candidate)}, baseline_aa {len(baseline_aa)}"
        )
    if n < rule.min_blocks:
        raise RuleError(f"the first look is after {rule.min_blocks} blocks, not {n}")
    if n > rule.max_blocks:
        raise RuleError(f"{n} blocks run, beyond the rule's maximum of {rule.max_blocks}")
    base = np.asarray(baseline, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if np.any(base <= 0) or np.any(cand <= 0) or np.any(np.asarray(baseline_aa) <= 0):
        raise RuleError("values compared by ratio must be positive")
    d = np.log(cand / base)
    mean = float(np.mean(d))
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    c = rule.boundary(n)
    floor = stats.noise_floor(stats.estimate_ratio(baseline, baseline_aa, seed=seed))
    ratio = math.exp(mean)
    low, high = math.exp(mean - c * se), math.exp(mean + c * se)
    decision: Decision = "continue"
    if abs(t) >= c and abs(ratio - 1.0) > floor:
        decision = "effect"
    elif abs(mean) + c * se < math.log1p(rule.margin):
        decision = "equivalent"
    elif n == rule.max_blocks:
        decision = "max"
    return Look(n, decision, ratio, low, high, t, c, floor)


def first_stop(
    rule: Rule,
    baseline: Sequence[float],
    candidate: Sequence[float],
    baseline_aa: Sequence[float],
    *,
    seed: int,
) -> Look | None:
    """The first look at which the rule stops, over the blocks given (None: it goes on)."""
    for n in range(rule.min_blocks, min(len(baseline), rule.max_blocks) + 1):
        at = look(rule, baseline[:n], candidate[:n], baseline_aa[:n], seed=seed)
        if at.stopped:
            return at
    return None
