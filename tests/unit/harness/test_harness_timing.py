"""Interleaved schedule and bounded warm-up, on a deterministic fake clock."""

from autopilot_harness import stats
from autopilot_harness.timing import interleaved, warm_up


class FakeTimer:
    """Each callable returns its own 'duration'; no real clock involved."""

    overhead_ns = 0

    def time_ns(self, fn):
        return fn()

    def run(self, fn):
        return fn(), None


def test_interleaved_pairs_every_candidate_with_the_baseline_in_random_order():
    aa, ab = interleaved(
        lambda: 100, {"B": lambda: 103, "C": lambda: 90}, pairs=50, timer=FakeTimer(), seed=4
    )
    assert len(aa.a_ns) == len(aa.b_ns) == 50
    assert set(aa.a_ns) == set(aa.b_ns) == {100}
    assert ab["B"].b_ns == [103] * 50
    assert ab["C"].b_ns == [90] * 50
    orders = ab["B"].order
    assert 10 < orders.count("AB") < 40  # both orders occur: order effects cancel
    assert stats.estimate_ratio(ab["B"].a_ns, ab["B"].b_ns).ratio == 1.03


def test_interleaved_reports_progress_per_round():
    seen = []
    interleaved(
        lambda: 1,
        {"B": lambda: 1},
        pairs=7,
        timer=FakeTimer(),
        seed=0,
        on_round=lambda done, total: seen.append((done, total)),
    )
    assert seen == [(i, 7) for i in range(1, 8)]


def test_warm_up_stops_when_rounds_agree():
    times = iter([500, 400, 300, 200, 110, 100, 100, 100] + [100] * 100)
    result = warm_up(lambda: next(times), FakeTimer(), round_calls=2, settle_rel=0.05)
    assert result.settled
    assert result.calls == 8


def test_warm_up_is_bounded_when_timing_never_settles():
    counter = iter(range(1, 10_000))
    result = warm_up(lambda: 2 ** min(next(counter), 60), FakeTimer(), round_calls=5, max_calls=40)
    assert not result.settled
    assert result.calls == 40
