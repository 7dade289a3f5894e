"""How an experiment's events read in its job log."""

from __future__ import annotations

from app.jobs.logs import event_line


def test_harness_progress_reads_run_i_of_n() -> None:
    event = {"type": "progress", "stage": "timing", "done": 12, "total": 30}
    assert event_line(event) == "[progress] run 12/30 (timing)"
    assert event_line({"type": "progress", "done": 1, "total": 2}) == "[progress] run 1/2"


def test_other_events_read_as_they_came() -> None:
    assert event_line({"type": "log", "message": "warming up"}) == "[log] warming up"
    odd = {"type": "progress", "done": "x"}
    assert event_line(odd) == f"[progress] {odd}"
