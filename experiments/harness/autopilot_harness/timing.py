"""Timers, bounded warm-up and the randomised-block interleaved schedule of paired runs.

CPU calls are timed with ``time.perf_counter_ns`` as the harness bound it at import
(`clocks`); CUDA calls with events recorded on the current stream, the whole device
synchronised before and after each call, so a timing never straddles two calls nor takes in
work queued before it. Each timed call of the interleaved schedule is also timed from outside
the timer with CLOCK_MONOTONIC (`ClockCheck`): a timer made to under- or over-report is caught
by the disagreement.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autopilot_harness import clocks

Call = Callable[[], Any]


class Timer(Protocol):
    #: Allowed time outside the timed region of one call, as the outside clock sees it.
    overhead_ns: int

    def time_ns(self, fn: Call) -> int: ...

    def run(self, fn: Call) -> tuple[int, Any]: ...


class CpuTimer:
    overhead_ns = 10_000

    def time_ns(self, fn: Call) -> int:
        return self.run(fn)[0]

    def run(self, fn: Call, _now: Callable[[], int] = clocks.perf_counter_ns) -> tuple[int, Any]:
        """(time in ns, output) of one call; `_now` is bound when the harness loads."""
        start = _now()
        out = fn()
        return max(_now() - start, 1), out


class CudaTimer:
    overhead_ns = 2_000_000

    def __init__(self) -> None:
        from autopilot_harness._torch import require_torch

        self._torch = require_torch()

    def time_ns(self, fn: Call) -> int:
        return self.run(fn)[0]

    def run(self, fn: Call) -> tuple[int, Any]:
        """(time in ns, output) of one call, between events on the current stream, with the
        whole device synchronised before (no earlier work runs inside the window) and after (no
        work of the call, on any stream, runs past it)."""
        cuda = self._torch.cuda
        start = cuda.Event(enable_timing=True)
        end = cuda.Event(enable_timing=True)
        cuda.synchronize()
        start.record()
        out = fn()
        end.record()
        cuda.synchronize()
        return max(int(start.elapsed_time(end) * 1e6), 1), out


class Arm:
    """A call whose inputs are made before, and whose output is looked at after, the timed
    region: `prepare()` gives the thunk to time, `inspect(output)` sees what it returned."""

    def __init__(
        self,
        prepare: Callable[[], Call],
        inspect: Callable[[Any], None] | None = None,
    ) -> None:
        self.prepare = prepare
        self.inspect = inspect


def measure(
    timer: Timer, call: Call | Arm, _outside: Callable[[], int] = clocks.monotonic_ns
) -> tuple[int, int]:
    """(the timer's time, CLOCK_MONOTONIC's time around the timer) of one call."""
    thunk = call.prepare() if isinstance(call, Arm) else call
    started = _outside()
    ns, out = timer.run(thunk)
    wall = _outside() - started
    if isinstance(call, Arm) and call.inspect is not None:
        call.inspect(out)
    return ns, wall


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
    deadline = clocks.monotonic_ns() + int(max_seconds * 1e9)
    calls = 0
    previous: float | None = None
    current = 0.0
    while True:
        samples = [timer.time_ns(fn) for _ in range(round_calls)]
        calls += round_calls
        current = _median(samples)
        if previous is not None and abs(current - previous) <= settle_rel * previous:
            return WarmUp(calls, True, current)
        if calls >= max_calls or clocks.monotonic_ns() >= deadline:
            return WarmUp(calls, False, current)
        previous = current


def median_time_ns(fn: Call, timer: Timer, calls: int) -> float:
    return _median([timer.time_ns(fn) for _ in range(max(calls, 1))])


@dataclass
class PairedSamples:
    """Timings of one comparison, pair by pair, with the order each pair ran in, and each
    call's time by the outside clock (`a_wall_ns`, `b_wall_ns`: for `ClockCheck`)."""

    a_ns: list[int] = field(default_factory=list)
    b_ns: list[int] = field(default_factory=list)
    order: list[str] = field(default_factory=list)
    a_wall_ns: list[int] = field(default_factory=list)
    b_wall_ns: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, list[int] | list[str]]:
        return {"a_ns": self.a_ns, "b_ns": self.b_ns, "order": self.order}


def run_pair(
    fa: Call | Arm, fb: Call | Arm, timer: Timer, rng: random.Random, into: PairedSamples
) -> None:
    if rng.random() < 0.5:
        ta, wa = measure(timer, fa)
        tb, wb = measure(timer, fb)
        into.order.append("AB")
    else:
        tb, wb = measure(timer, fb)
        ta, wa = measure(timer, fa)
        into.order.append("BA")
    into.a_ns.append(ta)
    into.b_ns.append(tb)
    into.a_wall_ns.append(wa)
    into.b_wall_ns.append(wb)


@dataclass(frozen=True)
class ClockCheck:
    """Whether the timer's samples of one arm agree with the outside clock around them.

    A timed call lies inside the window the outside clock measured, so no sample may exceed
    its window (beyond `SLACK_NS`), and the typical sample (the median) must account for most
    of its window: the window less `timer.overhead_ns` and `SHARE` of it. Medians, so that one
    call preempted between the two clocks' reads is not a disagreement."""

    arm: str
    calls: int
    timed_ns: int
    wall_ns: int
    median_gap_ns: float
    worst_excess_ns: int
    agrees: bool
    reason: str | None

    SHARE = 0.1
    SLACK_NS = 20_000

    @classmethod
    def of(cls, arm: str, timed: Sequence[int], wall: Sequence[int], timer: Timer) -> ClockCheck:
        gaps = [w - t for t, w in zip(timed, wall, strict=True)]
        excess = max((-g for g in gaps), default=0)
        median_gap = _median(gaps) if gaps else 0.0
        allowed = timer.overhead_ns + cls.SHARE * (_median(list(wall)) if wall else 0.0)
        reason = None
        if excess > cls.SLACK_NS:
            reason = (
                f"a sample of {arm} is {excess} ns longer than the outside clock's window "
                "around it: the timer over-reports"
            )
        elif median_gap > allowed:
            reason = (
                f"the samples of {arm} miss a median {median_gap:.0f} ns of the outside "
                f"clock's window around each call (at most {allowed:.0f} ns is timer overhead):"
                " the timer under-reports"
            )
        return cls(
            arm, len(gaps), sum(timed), sum(wall), median_gap, excess, reason is None, reason
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "arm": self.arm,
            "calls": self.calls,
            "timed_ns": self.timed_ns,
            "wall_ns": self.wall_ns,
            "median_gap_ns": self.median_gap_ns,
            "worst_excess_ns": self.worst_excess_ns,
            "agrees": self.agrees,
            "reason": self.reason,
        }


def interleaved(
    baseline: Call | Arm,
    candidates: dict[str, Call] | dict[str, Arm] | dict[str, Call | Arm],
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
    jobs: list[tuple[str | None, Call | Arm]] = [(None, baseline)]
    jobs += list(candidates.items())
    for done in range(pairs):
        rng.shuffle(jobs)
        for name, fb in jobs:
            run_pair(baseline, fb, timer, rng, aa if name is None else ab[name])
        if on_round is not None:
            on_round(done + 1, pairs)
    return aa, ab
