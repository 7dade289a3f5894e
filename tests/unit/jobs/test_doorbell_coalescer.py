"""The API's advance doorbell for new cycles: ids gathered per window, every one sent once."""

from __future__ import annotations

import threading

from app.broker import Coalescer


class Recorder:
    def __init__(self, fail_first: bool = False) -> None:
        self.batches: list[list[int]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()
        self.called = threading.Event()

    def __call__(self, ids: list[int]) -> None:
        self.called.set()
        with self.lock:
            if self.fail_first:
                self.fail_first = False
                raise ConnectionError("broker down")
            self.batches.append(list(ids))


def test_a_burst_is_sent_in_at_most_two_messages_with_every_id_once() -> None:
    ring = Recorder()
    doorbell = Coalescer(ring, window_s=0.5)
    for cycle_id in range(1, 51):
        doorbell.add(cycle_id)
    doorbell.close()  # sends what is pending, then stops
    # The first ring goes out at once (leading edge); the rest of the burst waits for the window.
    assert len(ring.batches) <= 2
    assert [i for batch in ring.batches for i in batch] == list(range(1, 51))


def test_close_sends_what_is_pending_and_drops_later_ones() -> None:
    ring = Recorder()
    doorbell = Coalescer(ring, window_s=60.0)  # a window the test never waits out
    doorbell.add(7)
    doorbell.close()
    assert ring.batches == [[7]]
    # A trigger still in flight at shutdown has committed its cycle: never an error after
    # that; its doorbell is left to the reaper.
    doorbell.add(8)
    assert ring.batches == [[7]]


def test_a_failed_ring_does_not_stop_the_next_ones() -> None:
    ring = Recorder(fail_first=True)
    doorbell = Coalescer(ring, window_s=0.0)
    doorbell.add(1)
    assert ring.called.wait(timeout=30)  # the first ring was tried (and failed)
    doorbell.add(2)
    doorbell.close()
    # Cycle 1's doorbell is lost with the broker (the reaper rings it again); 2 still goes out.
    assert ring.batches == [[2]]
