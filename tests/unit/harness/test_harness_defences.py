"""The harness's defences of its own measurement, piece by piece: clocks bound at import, the
outside clock's cross-check of a timer, the snapshot of the harness's own code."""

from __future__ import annotations

import time

import pytest
from autopilot_harness import clocks, experiment, integrity, timing
from autopilot_harness.timing import ClockCheck, CpuTimer, measure


def test_a_clock_replaced_after_import_does_not_change_the_timer_and_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(time, "perf_counter_ns", lambda: 0)
    ns, out = CpuTimer().run(lambda: time.sleep(0.002) or "done")
    assert out == "done"
    assert ns >= 2_000_000  # timed with the bound clock, not the replaced one
    assert clocks.replaced() == ["time.perf_counter_ns"]
    monkeypatch.undo()
    assert clocks.replaced() == []


def test_the_outside_clock_agrees_with_an_honest_timer() -> None:
    timer = CpuTimer()
    timed, wall = zip(*(measure(timer, lambda: sum(range(20_000))) for _ in range(15)), strict=True)
    check = ClockCheck.of("honest", list(timed), list(wall), timer)
    assert check.agrees, check


class HalvingTimer(CpuTimer):
    def run(self, fn, _now=clocks.perf_counter_ns):  # type: ignore[no-untyped-def]
        ns, out = super().run(fn)
        return max(ns // 2, 1), out


class DoublingTimer(CpuTimer):
    def run(self, fn, _now=clocks.perf_counter_ns):  # type: ignore[no-untyped-def]
        ns, out = super().run(fn)
        return ns * 2, out


@pytest.mark.parametrize(
    ("timer", "word"), [(HalvingTimer(), "under-reports"), (DoublingTimer(), "over-reports")]
)
def test_a_timer_that_misreports_disagrees_with_the_outside_clock(
    timer: CpuTimer, word: str
) -> None:
    def work() -> None:
        time.sleep(0.001)

    timed, wall = zip(*(measure(timer, work) for _ in range(9)), strict=True)
    check = ClockCheck.of("candidate", list(timed), list(wall), timer)
    assert not check.agrees
    assert check.reason is not None and word in check.reason


def test_an_arms_inputs_are_made_and_its_output_seen_outside_the_timed_region() -> None:
    seen: list[object] = []
    arm = timing.Arm(lambda: lambda: time.sleep(0.001) or 7, seen.append)
    ns, wall = measure(CpuTimer(), arm)
    assert seen == [7]
    assert 1_000_000 <= ns <= wall


def test_the_snapshot_names_a_replaced_method_and_a_replaced_code_object(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    snap = integrity.Snapshot()
    assert snap.changed() == []
    monkeypatch.setattr(CpuTimer, "run", lambda self, fn: (1, fn()))
    assert snap.changed() == ["autopilot_harness.timing.CpuTimer.run"]
    monkeypatch.undo()
    monkeypatch.setattr(timing.run_pair, "__code__", (lambda *a: None).__code__)
    assert snap.changed() == ["autopilot_harness.timing.run_pair.__code__"]
    monkeypatch.undo()
    monkeypatch.setattr(experiment, "SPOT_CHECKS", 0)
    monkeypatch.setattr(CpuTimer, "overhead_ns", 10**12)
    assert snap.changed() == [
        "autopilot_harness.experiment.SPOT_CHECKS",
        "autopilot_harness.timing.CpuTimer.overhead_ns",
    ]
    monkeypatch.undo()
    assert snap.changed() == []
