"""The demo's lock on its state dir: one `autopilot demo` per state dir, and what it runs.

`<state dir>/demo.lock` is held with `flock` for the demo's whole life and names its pid, URL,
start time and the pids of the services it started. The kernel drops the lock when the demo's
process dies, however it dies, so a lock file nobody holds is stale and is taken over. It lives
in `app` (not next to the demo in `workers`) because `autopilot status` reads it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LOCK_NAME = "demo.lock"


def lock_path(state_dir: Path) -> Path:
    return state_dir.absolute() / LOCK_NAME


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


@dataclass
class DemoRecord:
    """What the lock file says: the demo's process, its URL and its services (name -> pid)."""

    pid: int
    url: str
    started_at: str
    services: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["services"] = [
            {"name": name, "pid": pid, "alive": alive(pid)} for name, pid in self.services.items()
        ]
        return data

    @classmethod
    def parse(cls, text: str) -> DemoRecord | None:
        try:
            data = json.loads(text)
            return cls(
                pid=int(data["pid"]),
                url=str(data["url"]),
                started_at=str(data["started_at"]),
                services={str(k): int(v) for k, v in data.get("services", {}).items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class DemoRunning(Exception):
    """Another demo holds the lock on this state dir."""

    def __init__(self, record: DemoRecord | None, path: Path) -> None:
        self.record = record
        self.path = path
        who = f"pid {record.pid}, {record.url}" if record else "its record is unreadable"
        super().__init__(f"a demo is already running on {path.parent} ({who})")


class DemoLock:
    """The held lock: the demo rewrites its record as it starts services; `release` frees it."""

    def __init__(self, fd: int, path: Path, record: DemoRecord) -> None:
        self.fd, self.path, self.record = fd, path, record

    def _write(self) -> None:
        # One write after the truncate: a reader that lands between the two sees an empty
        # file and reads again (`_read_held`).
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(asdict(self.record)).encode(), 0)

    def add_service(self, name: str, pid: int) -> None:
        self.record.services[name] = pid
        self._write()

    def release(self) -> None:
        # Emptied, never unlinked: a demo that opened this inode a moment ago must not end up
        # holding a lock on a file the next demo can no longer see.
        os.ftruncate(self.fd, 0)
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


def acquire(state_dir: Path, url: str) -> tuple[DemoLock, DemoRecord | None]:
    """Take the lock, or raise DemoRunning naming the demo that holds it. Returns the lock and
    the stale record of a demo that died holding it, if any."""
    path = lock_path(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by the services
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_held(path)
        try:
            if holder is not None:
                raise DemoRunning(holder, path) from None
            # No live demo behind it: `autopilot status` reading it, or a demo dying just now.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DemoRunning(None, path) from None
        except DemoRunning:
            os.close(fd)
            raise
    stale = DemoRecord.parse(path.read_text(encoding="utf-8"))
    record = DemoRecord(
        pid=os.getpid(), url=url, started_at=datetime.now(UTC).isoformat(timespec="seconds")
    )
    lock = DemoLock(fd, path, record)
    lock._write()
    return lock, stale


def running(state_dir: Path) -> DemoRecord | None:
    """The demo that holds the lock on this state dir, or None (no lock file, or a stale one)."""
    path = lock_path(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return _read_held(path)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _read_held(path: Path, timeout: float = 2.0) -> DemoRecord | None:
    """The record of a held lock. The holder writes it right after taking the lock, so an empty
    or half-written file, or a dead demo's record not yet replaced, is read again briefly."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError):
            record = DemoRecord.parse(path.read_text(encoding="utf-8"))
            if record is not None and alive(record.pid):
                return record
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
