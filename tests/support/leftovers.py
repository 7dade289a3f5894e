"""No test leaves a process behind: every process a test run starts carries the run's mark in
its environment (`RA_TEST_RUN`, inherited; workers' environments keep it, as it is not an
`AUTOPILOT_*` setting), so what is still alive at the end of the run can be found and killed.

A process that clears its environment (a sandboxed experiment) is not found this way; it lives
in a cgroup its worker kills.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

MARK = "RA_TEST_RUN"
#: How long processes being torn down get to finish exiting before they count as left.
EXIT_GRACE_S = 5.0


def mark_session() -> None:
    """Mark this run (once: xdist workers keep their controller's mark)."""
    os.environ.setdefault(MARK, uuid.uuid4().hex)


def _marked(pid: int, needle: bytes) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone, a zombie, or not ours to read
        return False


def _xdist_worker_of(pid: int, parent: int) -> bool:
    """An xdist worker of this controller (it ends with the run, not a test's leftover); a
    worker's own children are never that."""
    if "PYTEST_XDIST_WORKER" in os.environ:
        return False
    try:
        ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError, IndexError):
        return False
    return ppid == parent and b"PYTEST_XDIST_WORKER=" in environ


def alive(mark: str | None = None) -> list[int]:
    """The pids of the processes of the run marked `mark` (this run's by default), but this
    process and its xdist workers."""
    mark = mark or os.environ.get(MARK)
    if not mark:
        return []
    needle = f"{MARK}={mark}".encode()
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if _marked(pid, needle) and not _xdist_worker_of(pid, me):
            found.append(pid)
    return found


def describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        argv = "?"
    return f"  pid {pid}: {argv.strip()[:300]}"


def kill_left(mark: str | None = None) -> list[str]:
    """Processes of the run still alive after `EXIT_GRACE_S`: each described, then killed."""
    deadline = time.monotonic() + EXIT_GRACE_S
    while (pids := alive(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [describe(pid) for pid in pids]
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left
