"""Timers, bounded warm-up and the randomised-block interleaved schedule of paired runs.

CPU calls are timed with ``time.perf_counter_ns``; CUDA calls with events recorded on the
current stream and synchronised after each call, so a timing never straddles two calls.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

Call = Callable[[], Any]


class Timer(Protocol):
    def time_ns(self, fn: Call) -> int: ...


class CpuTimer:
    def time_ns(self, fn: Call) -> int:
        start = time.perf_counter_ns()
        fn()
        return max(time.perf_counter_ns() - start, 1)


class CudaTimer:
    def __init__(self) -> None:
        from autopilot_harness._torch import require_torch

        self._torch = require_torch()

    def time_ns(self, fn: Call) -> int:
        cuda = self._torch.cuda
        start = cuda.Event(enable_timing=True)
        end = cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return max(int(start.elapsed_time(end) * 1e6), 1)


def _median(values: Sequence[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[mid])
    return (ordered[mid - 1] + ordered[mid]) / 2.0


@dataclass(frozen=True)
class WarmUp:
    calls: int
    settled: bool
    median_ns: float


def warm_up(
    fn: Call,
    timer: Timer,
    *,
    round_calls: int = 5,
    settle_rel: float = 0.03,
    max_calls: int = 200,
    max_seconds: float = 5.0,
) -> WarmUp:
    """Run ``fn`` in rounds until two consecutive round medians agree within ``settle_rel``.

    Bounded by calls and by wall time so a workload that never settles (thermal drift, a
    noisy neighbour) still gets measured, and the result says it did not settle.
    """
    deadline = time.monotonic() + max_seconds
    calls = 0
    previous: float | None = None
    current = 0.0
    while True:
        samples = [timer.time_ns(fn) for _ in range(round_calls)]
        calls += round_calls
        current = _median(samples)
        if previous is not None and abs(current - previous) <= settle_rel * previous:
            return WarmUp(calls, True, current)
        if calls >= max_calls or time.monotonic() >= deadline:
            return WarmUp(calls, False, current)
        previous = current


def median_time_ns(fn: Call, timer: Timer, calls: int) -> float:
    return _median([timer.time_ns(fn) for _ in range(max(calls, 1))])


@dataclass
class PairedSamples:
    """Timings of one comparison, pair by pair, with the order each pair ran in."""

    a_ns: list[int] = field(default_factory=list)
    b_ns: list[int] = field(default_factory=list)
    order: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[int] | list[str]]:
        return {"a_ns": self.a_ns, "b_ns": self.b_ns, "order": self.order}


def run_pair(fa: Call, fb: Call, timer: Timer, rng: random.Random, into: PairedSamples) -> None:
    if rng.random() < 0.5:
        ta = timer.time_ns(fa)
        tb = timer.time_ns(fb)
        into.order.append("AB")
    else:
        tb = timer.time_ns(fb)
        ta = timer.time_ns(fa)
        into.order.append("BA")
    into.a_ns.append(ta)
    into.b_ns.append(tb)


def interleaved(
    baseline: Call,
    candidates: dict[str, Call],
    *,
    pairs: int,
    timer: Timer,
    seed: int,
    on_round: Callable[[int, int], None] | None = None,
) -> tuple[PairedSamples, dict[str, PairedSamples]]:
    """Randomised blocks: each round runs one A/A pair and one A/B pair per candidate.

    The comparisons of a round run in a shuffled order and each pair in a random order (AB
    or BA), so drift, a neighbour's bursts and cache order effects fall on A and B alike.
    Returns the A/A samples and the samples of each candidate against the baseline.
    """
    rng = random.Random(seed)  # noqa: S311 - a reproducible schedule, not a secret
    aa = PairedSamples()
    ab = {name: PairedSamples() for name in candidates}
    jobs: list[tuple[str | None, Call]] = [(None, baseline)]
    jobs += list(candidates.items())
    for done in range(pairs):
        rng.shuffle(jobs)
        for name, fb in jobs:
            run_pair(baseline, fb, timer, rng, aa if name is None else ab[name])
        if on_round is not None:
            on_round(done + 1, pairs)
    return aa, ab
