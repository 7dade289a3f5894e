"""A job's log on the control host: the whole log a GPU host uploaded when the job ended, else
the bounded tail (`Job.log_tail`) its worker keeps in the ops DB while the job runs.

Nothing here reads a GPU host's disk (docs/design.md, "Hosts and boundaries"): the file read is the
one the upload stored under the control host's own state dir, or, on a one-machine install, the
very file the worker writes there. The upload opens its own short sessions, so no transaction
stays open while a body of up to `max_job_log_bytes` arrives.
"""

from __future__ import annotations

import logging
import mmap
import os
import tempfile
from collections.abc import AsyncIterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from anyio import to_thread

from app import broker
from app.clock import utcnow
from app.db import Stores
from app.errors import AutopilotError, Conflict
from app.jobs import paths
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED, WAITING
from app.jobs.models import Job
from app.settings import Settings

log = logging.getLogger(__name__)
READ_BYTES = 1024 * 1024  # read of a stored log per step: a follower catches up in steps
_MAX_CANDIDATES = 1000  # places tried where the last tail may end in the next one
UPLOAD_TYPES = ("text/plain", "application/octet-stream")


class JobLogTooLarge(AutopilotError):
    status = 413
    slug = "too-large"
    title = "Request too large"


class JobLogWrongType(AutopilotError):
    status = 415
    slug = "unsupported-media-type"
    title = "Unsupported media type"


class JobNotStarted(Conflict):
    slug = "job-not-started"
    title = "Job not started"


# -- reading ---------------------------------------------------------------------------------


def stored_log(settings: Settings, job: Job) -> Path | None:
    """The job's whole log on this host, or None when there is none (yet).

    Where an upload lands comes first: a path the job records may be one its GPU host wrote on
    its own disk, which exists here only on a one-machine install (and then it is this file).
    """
    for path in (paths.log_path(settings, job.id), paths.log_path(settings, job.id, job.log_path)):
        if path.is_file():
            return path
    return None


def whole_log(path: Path) -> Iterator[bytes] | None:
    """The file's bytes as they are now, in chunks (a log still growing is cut where it was when
    opened); None when it is gone. Opened at once, so a later rename does not matter."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed by the generator
    except FileNotFoundError:
        return None
    return _chunks(handle, os.fstat(handle.fileno()).st_size)


def _chunks(handle: BinaryIO, size: int) -> Iterator[bytes]:
    with handle:
        left = size
        while left > 0 and (chunk := handle.read(min(READ_BYTES, left))):
            left -= len(chunk)
            yield chunk


def _from_line(data: bytes, cut: bool) -> str:
    """`data` decoded; when `cut` (its first byte is the one before the window) from the first
    line boundary on, so a tail never starts mid-line unless the line is longer than the tail."""
    if cut:
        newline = data.find(b"\n")
        data = data[newline + 1 :] if newline != -1 else data[1:]
    return data.decode("utf-8", "replace")


def tail_text(path: Path, limit_bytes: int) -> str:
    """The last `limit_bytes` of the file at most, from a line boundary; "" when it is missing."""
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            start = max(0, size - limit_bytes - 1)
            handle.seek(start)
            return _from_line(handle.read(size - start), start > 0 or size > limit_bytes)
    except FileNotFoundError:
        return ""


def trim_tail(text: str, limit_bytes: int) -> str:
    """The end of a tail already in memory, bounded the same way as `tail_text`."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit_bytes:
        return text
    return _from_line(data[-limit_bytes - 1 :], True)


def appended(before: str, after: str) -> str:
    """What `after` adds to `before`, both the end of one growing log read at two moments, each
    starting at a line boundary.

    `before` ends where their longest overlap puts it, and an overlap starts with `after`'s first
    line. A log that repeats itself line for line can hide new lines from this; when more than a
    whole tail was written between the two reads, nothing overlaps and all of `after` is new.
    """
    if not before:
        return after
    first = after[: after.find("\n") + 1] or after
    start = before.find(first)
    for _ in range(_MAX_CANDIDATES):
        if start == -1:
            break
        overlap = len(before) - start
        if after.startswith(before[start:]):
            return after[overlap:]
        start = before.find(first, start + 1)
    return after


def _resume_offset(path: Path, seen: str) -> int:
    """Where the text a follower already showed (from the DB's tail) ends in the uploaded file;
    0 (show it all again) when it cannot be found."""
    needle = seen.encode("utf-8")
    try:
        with (
            open(path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as m,
        ):
            found = m.rfind(needle)
    except (OSError, ValueError):  # gone, or empty (an empty file cannot be mapped)
        return 0
    return found + len(needle) if found != -1 else 0


@dataclass
class LogFollower:
    """What is new in a job's log since the last call: the stored file's new bytes while it
    exists, else what the DB's tail adds. Whole lines only, until the job is over (`final`)."""

    path: Path | None = None
    offset: int = 0
    partial: bytes = b""
    seen: str = ""  # the last tail read from the DB, before there was a file
    behind: bool = False  # the last read stopped at READ_BYTES: read again before waiting

    def read(self, settings: Settings, job: Job, *, final: bool) -> str:
        path = stored_log(settings, job)
        if path is not None:
            if self.path is None and self.seen:
                self.offset = _resume_offset(path, self.seen)
            self.path = path
            return self._read_file(path, final)
        if self.path is not None:  # the file went away: nothing more to show from it
            self.behind = False
            return self._lines(b"", final)
        view = job.log_tail or ""
        if not final:
            view = view[: view.rfind("\n") + 1]
        new, self.seen = appended(self.seen, view), view
        return new

    def _read_file(self, path: Path, final: bool) -> str:
        try:
            with open(path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read(READ_BYTES)
        except FileNotFoundError:
            data = b""
        self.offset += len(data)
        self.behind = len(data) == READ_BYTES
        return self._lines(data, final and not self.behind)

    def _lines(self, data: bytes, final: bool) -> str:
        data = self.partial + data
        if final:
            self.partial = b""
        else:
            cut = data.rfind(b"\n") + 1
            data, self.partial = data[:cut], data[cut:]
        return data.decode("utf-8", "replace")


# -- the upload ------------------------------------------------------------------------------


def _check_upload(stores: Stores, job_id: int) -> None:
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        if job.state in WAITING:
            raise JobNotStarted(
                f"job {job_id} is {job.state}: it has no log until a GPU worker starts it"
            )


def _record_upload(stores: Stores, job_id: int, path: Path) -> int | None:
    """Record where the log is; once its job has ended, that the whole log has arrived. The
    job's cycle to ring then (it waits for the log before it reads the job), else None."""
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        job.log_path = str(path)
        ended = job.state in FINISHED
        if ended:
            job.log_received_at = utcnow()
        session.flush()
        return job.cycle_id if ended else None


def _ring(settings: Settings, cycle_id: int) -> None:
    try:
        broker.ring_advance(settings, cycle_id)
    except Exception:  # the broker is away: the reaper re-rings stale cycles (cycles.stale)
        log.warning("cycle %s: advance doorbell not sent after its log", cycle_id, exc_info=True)


class _Upload:
    """A temp file beside the log, renamed over it once complete: a reader never sees half a
    log, and the source may be the log itself (a one-machine install uploads its own file)."""

    def __init__(self, target: Path, max_bytes: int) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
        self.target, self.temp, self.max_bytes, self.size = target, Path(name), max_bytes, 0
        self.handle = os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise JobLogTooLarge(
                f"the log exceeds {self.max_bytes} bytes (AUTOPILOT_MAX_JOB_LOG_BYTES)"
            )
        self.handle.write(chunk)

    def commit(self) -> None:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        os.replace(self.temp, self.target)

    def discard(self) -> None:
        self.handle.close()
        self.temp.unlink(missing_ok=True)


async def receive_upload(
    stores: Stores,
    settings: Settings,
    job_id: int,
    content_type: str | None,
    body: AsyncIterable[bytes],
) -> int:
    """Store a job's whole log as the control host's copy and record where; its size."""
    media = (content_type or "application/octet-stream").split(";", 1)[0].strip().lower()
    if media not in UPLOAD_TYPES:
        raise JobLogWrongType(f"a job's log is sent as {' or '.join(UPLOAD_TYPES)}, not {media}")
    await to_thread.run_sync(_check_upload, stores, job_id)
    target = paths.log_path(settings, job_id)
    upload = await to_thread.run_sync(_Upload, target, settings.max_job_log_bytes)
    try:
        async for chunk in body:
            await to_thread.run_sync(upload.write, chunk)
        await to_thread.run_sync(upload.commit)
    finally:
        upload.discard()
    cycle_id = await to_thread.run_sync(_record_upload, stores, job_id, target)
    if cycle_id is not None:
        await to_thread.run_sync(_ring, settings, cycle_id)
    return upload.size


def event_line(event: Mapping[str, Any]) -> str:
    """How an experiment's `log` or `progress` event reads in its job log. The harness's
    progress (`{"type": "progress", "stage": "timing", "done": 12, "total": 30}`, one per timing
    round) reads "[progress] run 12/30 (timing)"; another shape is shown as it came."""
    kind = event.get("type")
    if kind == "progress":
        done, total = event.get("done"), event.get("total")
        if isinstance(done, int) and isinstance(total, int):
            stage = event.get("stage")
            return f"[progress] run {done}/{total}" + (f" ({stage})" if stage else "")
    return f"[{kind}] {event.get('message') or dict(event)}"
