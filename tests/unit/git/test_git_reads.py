"""The remembered git reads: only outputs that are an object's content alone, bounded by bytes."""

from __future__ import annotations

from app.git import runner as gitrunner
from app.git.runner import _ObjectReads

SHA = "0123456789abcdef0123456789abcdef01234567"


def test_only_content_reads_of_full_ids_are_kept() -> None:
    ok = _ObjectReads.cacheable
    assert ok(["cat-file", "blob", SHA], None, None)
    assert ok(["cat-file", "-p", f"{SHA}:autopilot.toml"], None, None)
    assert ok(["ls-tree", "-r", "-z", "--full-tree", SHA], None, None)
    assert ok(["show", f"{SHA}:src/kernel.py"], None, None)
    assert not ok(["cat-file", "-e", SHA], None, None)  # exists *here*: can change
    assert not ok(["cat-file", "-t", SHA], None, None)
    assert not ok(["show", SHA], None, None)  # a commit's show prints notes, mailmapped names
    assert not ok(["ls-tree", "HEAD"], None, None)  # a ref moves
    assert not ok(["ls-tree", SHA[:12]], None, None)  # an abbreviation may grow ambiguous
    assert not ok(["cat-file", "blob", SHA], b"x", None)
    assert not ok(["cat-file", "blob", SHA], None, {"GIT_DIR": "/elsewhere"})
    assert not ok(["rev-parse", SHA], None, None)


def test_kept_outputs_are_bounded_by_bytes_oldest_out_first(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(gitrunner, "_READS_KEPT_BYTES", 1000)
    monkeypatch.setattr(gitrunner, "_READ_KEPT_MAX_BYTES", 600)
    reads = _ObjectReads()
    key = lambda n: ("/repo", ("cat-file", "blob", f"{n:040x}"))  # noqa: E731
    reads.put(key(1), b"a" * 400)
    reads.put(key(2), b"b" * 400)
    assert reads.get(key(1)) == b"a" * 400  # now the most recent
    reads.put(key(3), b"c" * 400)  # 1200 > 1000: the least recently used (2) goes
    assert reads.get(key(2)) is None
    assert reads.get(key(1)) is not None and reads.get(key(3)) is not None
    reads.put(key(4), b"d" * 700)  # larger than any one kept: not kept
    assert reads.get(key(4)) is None
    reads.put(key(3), b"e" * 100)  # replaced: counted once
    reads.put(key(5), b"f" * 500)
    assert reads.get(key(1)) is not None and reads.get(key(5)) is not None
