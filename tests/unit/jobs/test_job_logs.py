"""Cutting a log's tail and telling what a newer tail adds: pure functions of app.jobs.logs."""

from __future__ import annotations

from pathlib import Path

from app.jobs.logs import appended, tail_text, trim_tail
from app.jobs.paths import LOG_TAIL_BYTES
from workers import control_client


def test_tail_starts_at_a_line_boundary(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    assert tail_text(log, 10) == ""  # no log yet
    log.write_bytes(b"first\nsecond\nthird\n")
    assert tail_text(log, 100) == "first\nsecond\nthird\n"
    assert tail_text(log, 9) == "third\n"  # "d\nthird\n" would start mid-line
    assert tail_text(log, 13) == "second\nthird\n"  # the cut falls right on a boundary
    assert tail_text(log, 12) == "third\n"
    log.write_bytes(b"x" * 50)
    assert tail_text(log, 10) == "x" * 10  # one line longer than the tail: its end
    log.write_bytes("é\n".encode() * 10 + b"\xff\n")
    assert tail_text(log, 8) == "é\né\n\ufffd\n"  # decoded with replacement
    assert tail_text(log, 7) == "é\n\ufffd\n"  # never half a character at the start


def test_one_bound_for_the_db_tail() -> None:
    # defined once (app.jobs.paths): the GPU host's heartbeat and its end of a job both cut
    # the tail with it; the control client keeps no copy of it
    assert LOG_TAIL_BYTES == 64 * 1024
    assert not hasattr(control_client, "LOG_TAIL_BYTES")
    assert not hasattr(control_client, "tail_text")


def test_trim_tail_bounds_text_the_same_way() -> None:
    assert trim_tail("a\nbb\ncc\n", 100) == "a\nbb\ncc\n"
    assert trim_tail("a\nbb\ncc\n", 5) == "cc\n"
    assert trim_tail("a\nbb\ncc\n", 6) == "bb\ncc\n"


def test_appended_finds_where_the_last_tail_ended() -> None:
    assert appended("", "a\nb\n") == "a\nb\n"
    assert appended("a\nb\n", "a\nb\n") == ""
    assert appended("a\nb\n", "a\nb\nc\n") == "c\n"  # the tail has not slid yet
    assert appended("a\nb\nc\n", "b\nc\nd\ne\n") == "d\ne\n"  # it slid
    assert appended("a\nb\n", "x\ny\n") == "x\ny\n"  # more than a tail came: all of it is new
    assert appended("step\nstep\n", "step\nstep\nstep\n") == "step\n"
    long = "".join(f"line {n}\n" for n in range(2000))
    assert appended(long[:9000], long[500:12000]) == long[9000:12000]
