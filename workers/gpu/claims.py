"""Who starts a reserved job: its reserver, or an idle worker of the same host that took it over
(app/jobs/service.py, `lease_next`). Decided on the host, not in the ops DB, so that the
reserver's start stays off the database on the GPU's idle gap (docs/benchmarks.md, handoff).

One small file per reservation, `<state>/reservations/<job>-<attempt>-<reserver>`, written under
an exclusive `flock`: the reserver writes `started` at its current job's end, just before it hands
the job to its parked interpreter; an idle worker writes `taken` just before it claims the job
in the ops DB. Whichever writes first wins, and the other leaves the job alone: the reserver
gives the reservation back, the idle worker leases something else. The attempt in the name
(the job's attempts when it was reserved) keeps a later reservation of the same job apart.

The reserver removes its file once the job's start is in the ops DB (the job is then running,
and no idle worker can take it); one left by a worker that died is removed with old job trees.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

STARTED, TAKEN = b"started", b"taken"


class Claims:
    """The reservation claims of one host (its state dir)."""

    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir.absolute() / "reservations"

    def path(self, job_id: int, attempt: int, reserver: str) -> Path:
        return self.root / f"{job_id}-{attempt}-{reserver.replace('/', '_')}"

    def start(self, job_id: int, attempt: int, reserver: str) -> bool:
        """The reserver is about to start the job: False when an idle worker took it over."""
        return self._write(self.path(job_id, attempt, reserver), STARTED, refuse=TAKEN)

    def take(self, job_id: int, attempt: int, reserver: str) -> bool:
        """An idle worker is about to take the job over: False when its reserver started it."""
        return self._write(self.path(job_id, attempt, reserver), TAKEN, refuse=STARTED)

    def forget(self, job_id: int, attempt: int, reserver: str) -> None:
        """The job's start is recorded, or the reservation is gone: nothing to decide any more."""
        self.path(job_id, attempt, reserver).unlink(missing_ok=True)

    def sweep(self, older_than_s: float) -> int:
        """Remove the claims last written more than `older_than_s` ago (a worker that died
        left them; a claim decides only while its reservation's lease lives)."""
        cutoff, removed = time.time() - older_than_s, 0
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return 0
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
        return removed

    def _write(self, path: Path, mark: bytes, *, refuse: bytes) -> bool:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
        try:
            fd = os.open(path, flags, 0o600)
        except FileNotFoundError:  # the host's first claim (this runs on the GPU's idle gap)
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.read(fd, 16) == refuse:
                return False
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, mark)
            return True
        finally:
            os.close(fd)  # (and the lock with it)
