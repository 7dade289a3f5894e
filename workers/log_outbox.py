"""A GPU host's durable outbox of finished jobs' logs: each log is put here before its job's
outcome is stored and leaves only once the control host has acknowledged its upload, so a
worker that dies between the two (or a control host that is away) loses no log.

An entry is `<state dir>/outbox/<job id>~<worker>`: a hard link to the job's finished log
(one `link(2)`, atomic, no copy; a copy renamed into place where links are refused). The
`LogSender`, one thread a worker process, uploads entries off the GPU's path, retries with
backoff, and looks at the folder again at its start and every `RESCAN_S`, so the entries a
dead worker of this host left are sent by the next worker that starts here.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED
from app.settings import Settings
from workers import control_client

log = logging.getLogger(__name__)

#: How often the sender looks at the folder for entries it does not know of (a dead worker's).
RESCAN_S = 30.0
#: Retry waits: the first, doubled after each failure, up to the last.
FIRST_RETRY_S, MAX_RETRY_S = 1.0, 300.0
#: Answers that will never change for this upload: the job is gone (404), queued again (409),
#: its log too large (413) or of a type refused (415). The entry is dropped, the tail stays.
REFUSED_FOR_GOOD = frozenset({404, 409, 413, 415, 422})


def folder(settings: Settings) -> Path:
    return settings.state_dir.absolute() / "outbox"


@dataclass(frozen=True)
class Entry:
    """One log waiting for its upload: whose job it is and which worker ran it."""

    path: Path
    job_id: int
    worker: str

    @classmethod
    def parse(cls, path: Path) -> Entry | None:
        job, sep, worker = path.name.partition("~")
        if not sep or not job.isdigit() or not worker:
            return None  # a temporary file being written, or something not ours
        return cls(path, int(job), urllib.parse.unquote(worker))


class LogOutbox:
    """The folder of entries: put one before the outcome is stored, drop one that is not due."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.folder = folder(settings)

    def put(self, job_id: int, worker: str) -> Entry | None:
        """The job's log, as it is now, into the outbox; None when it could not be put there
        (a full or read-only disk: the job's outcome is stored all the same, and the control
        host goes on with the tail once the log's grace has passed)."""
        target = self.folder / f"{job_id}~{urllib.parse.quote(worker, safe='@-.')}"
        source = paths.log_path(self.settings, job_id)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except FileExistsError:  # an earlier try of this very entry: the log is newer now
                self._replace(source, target)
            except FileNotFoundError:  # it never wrote a line: the control host gets that
                self._replace(None, target)
            except OSError:  # no hard links here (another filesystem): a copy
                self._replace(source, target)
        except OSError:
            log.warning("job %s: its log could not be put in the outbox", job_id, exc_info=True)
            return None
        return Entry(target, job_id, worker)

    def _replace(self, source: Path | None, target: Path) -> None:
        """`source` (or an empty log) copied beside `target`, then renamed over it."""
        fd, name = tempfile.mkstemp(dir=self.folder, prefix=".put-")
        try:
            with os.fdopen(fd, "wb") as out:
                if source is not None and source.exists():
                    with open(source, "rb") as src:
                        shutil.copyfileobj(src, out)
            os.replace(name, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(name)
            raise

    def drop(self, entry: Entry) -> None:
        with contextlib.suppress(FileNotFoundError):
            entry.path.unlink()

    def entries(self) -> list[Entry]:
        try:
            names = sorted(self.folder.iterdir())
        except FileNotFoundError:
            return []
        return [e for p in names if (e := Entry.parse(p)) is not None]


class LogSender:
    """The worker process's one sender: uploads each entry until the control host has it."""

    def __init__(self, stores: Stores, settings: Settings) -> None:
        self.stores, self.settings = stores, settings
        self.outbox = LogOutbox(settings)
        self._due: dict[Path, tuple[float, float]] = {}  # entry -> (next try, next wait)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start sending (idempotent): what the folder holds now first, a dead worker's too."""
        with self._wake:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="log-sender", daemon=True)
                self._thread.start()

    def send_soon(self, entry: Entry) -> None:
        """Send this entry now (its job's outcome is stored)."""
        with self._wake:
            self._due[entry.path] = (0.0, FIRST_RETRY_S)
            self._wake.notify()
        self.start()

    def pending(self) -> int:
        return len(self.outbox.entries())

    def _run(self) -> None:
        next_scan = 0.0
        while True:
            now = time.monotonic()
            if now >= next_scan:
                self._scan()
                next_scan = now + RESCAN_S
            with self._wake:
                due = [p for p, (at, _) in self._due.items() if at <= now]
            for path in due:
                self._try(path)
            with self._wake:
                soonest = min([at for at, _ in self._due.values()] + [next_scan])
                self._wake.wait(max(0.0, soonest - time.monotonic()))

    def _scan(self) -> None:
        found = {e.path for e in self.outbox.entries()}
        with self._wake:
            for path in found - self._due.keys():
                self._due[path] = (0.0, FIRST_RETRY_S)
            for gone in self._due.keys() - found:
                del self._due[gone]

    def _try(self, path: Path) -> None:
        entry = Entry.parse(path)
        done = True
        try:
            if entry is not None:
                done = self._send(entry)
        except Exception:
            log.warning("the outbox's entry %s was not sent", path.name, exc_info=True)
            done = False
        with self._wake:
            if done:
                self._due.pop(path, None)
            elif path in self._due:
                wait = self._due[path][1]
                self._due[path] = (time.monotonic() + wait, min(MAX_RETRY_S, wait * 2))

    def _send(self, entry: Entry) -> bool:
        """Upload one entry; True when it is done with (sent, or never to be sent)."""
        try:
            handle = open(entry.path, "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return True  # another worker of this host sent it
        with handle:
            try:  # one sender an entry: two workers of a host may both look at the folder
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            if not entry.path.exists():
                return True
            verdict = self._still_wanted(entry)
            if verdict is None:
                return False  # its run's lease has not lapsed yet: ask again later
            if verdict:
                try:
                    control_client.upload_log(self.settings, entry.job_id, entry.path)
                except control_client.LogUploadFailed as exc:
                    if exc.status not in REFUSED_FOR_GOOD:
                        log.warning("%s (kept in the outbox, tried again later)", exc)
                        return False
                    log.warning("%s (dropped: the job's tail stays its log)", exc)
            self.outbox.drop(entry)
        return True

    def _still_wanted(self, entry: Entry) -> bool | None:
        """Whether this host's copy is the job's log: the job ended with the outcome its worker
        stored (True); it was run again or given up meanwhile (False: a worker died after
        putting the entry and before storing the outcome); None while that run's lease holds."""
        with self.stores.ops_session() as session:
            try:
                job = jobs.get(session, entry.job_id)
            except jobs.JobNotFound:
                return False
            if job.worker != entry.worker:
                return False
            if job.state in FINISHED:
                return job.log_path is not None  # None: the reaper gave it up, no outcome
            return None if job.state in ("leased", "running") else False


_SENDERS: dict[Path, LogSender] = {}
_SENDERS_LOCK = threading.Lock()


def sender_for(stores: Stores, settings: Settings) -> LogSender:
    """This process's sender for the host's state dir, started (each doorbell's loop and the
    worker's start share it)."""
    key = folder(settings)
    with _SENDERS_LOCK:
        sender = _SENDERS.get(key)
        if sender is None:
            sender = _SENDERS[key] = LogSender(stores, settings)
    sender.start()
    return sender
