"""The GPU host's log outbox on disk (an entry is the finished log, linked under the job and its
worker) and the cycle's wait for a job's whole log, bounded by its grace."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from app.clock import utcnow
from app.cycles.steps.wait_for_job import LOG_GRACE_S, log_pending
from app.jobs import paths
from app.jobs.models import Job
from app.settings import Settings
from workers.log_outbox import Entry, LogOutbox


def test_an_entry_is_the_whole_log_under_its_job_and_worker(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path)
    log = paths.log_path(settings, 7)
    log.parent.mkdir(parents=True)
    log.write_bytes(b"line 1\nline 2\n")
    outbox = LogOutbox(settings)
    entry = outbox.put(7, "gpu-cpu-0-42@host-a")
    assert entry is not None
    assert outbox.entries() == [entry]
    assert (entry.job_id, entry.worker) == (7, "gpu-cpu-0-42@host-a")
    assert entry.path.read_bytes() == b"line 1\nline 2\n"
    again = outbox.put(7, "gpu-cpu-0-42@host-a")  # a second try replaces it, whole
    assert again == entry and outbox.entries() == [entry]
    outbox.drop(entry)
    assert outbox.entries() == []


def test_a_job_without_a_log_sends_an_empty_one(tmp_path: Path) -> None:
    outbox = LogOutbox(Settings(state_dir=tmp_path))
    entry = outbox.put(9, "w@h")
    assert entry is not None and entry.path.read_bytes() == b""
    (outbox.folder / ".put-half-written").write_bytes(b"x")  # never taken for an entry
    assert Entry.parse(outbox.folder / ".put-half-written") is None
    assert outbox.entries() == [entry]


def test_a_cycle_waits_for_the_log_within_its_grace() -> None:
    now = utcnow()
    ended = Job(state="succeeded", log_path="/gpu/jobs/1/job.log", finished_at=now)
    assert log_pending(ended, now)
    assert not log_pending(ended, now + timedelta(seconds=LOG_GRACE_S))  # goes on with the tail
    ended.log_received_at = now
    assert not log_pending(ended, now)
    never_ran = Job(state="failed", log_path=None, finished_at=now)  # given up: no log to come
    assert not log_pending(never_ran, now)
