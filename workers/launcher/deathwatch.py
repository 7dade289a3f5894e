"""The worker's death watch: one small process per worker that kills the worker's cgroups
(`*.w<worker pid>`: its jobs' and its parked interpreters') once the worker has exited, however
it exited, SIGKILL included.

It is what lets a job start with no `preexec_fn` (so CPython spawns with vfork): the job need
not arm PR_SET_PDEATHSIG itself, because it lives in a cgroup named for its worker, and the
watch holds a pidfd of the worker. No job registers with it: whatever cgroup carries the
worker's name when the worker dies is killed, so a worker that dies between a spawn and
anything it would have done next leaves nothing behind. It is started once per worker process
(again if it ever dies, or in a forked child) and exits after the worker's cleanup.

`main()` runs in the watch process and uses only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

#: How long the watch waits for a killed cgroup to empty before it moves on.
KILL_DEADLINE_S = 5.0
#: How long a worker waits for its new watch to say it is watching.
READY_TIMEOUT_S = 30.0
_ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the `workers` package
_RUN = (
    f"import sys; sys.path.insert(0, {str(_ROOT)!r}); "
    "from workers.launcher.deathwatch import main; main()"
)


class _Watch:
    def __init__(self, owner: int, base: Path, suffix: str, proc: subprocess.Popen[bytes]) -> None:
        self.owner, self.base, self.suffix, self.proc = owner, base, suffix, proc

    def live(self, base: Path, suffix: str) -> bool:
        return (
            self.owner == os.getpid()
            and self.base == base
            and self.suffix == suffix
            and self.proc.poll() is None
        )


_lock = threading.Lock()
_current: _Watch | None = None


def ensure(base: Path, suffix: str) -> bool:
    """True when a live watch kills this process's cgroups under `base` named `*<suffix>` at
    its death (one is started if needed); False when none can run here (no pidfd_open: the
    caller keeps the parent-death signal)."""
    global _current
    with _lock:
        if _current is not None and _current.live(base, suffix):
            return True
        _current = None
        proc = _start(base, suffix)
        if proc is None:
            return False
        _current = _Watch(os.getpid(), base, suffix, proc)
        return True


def _start(base: Path, suffix: str) -> subprocess.Popen[bytes] | None:
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        pidfd = os.pidfd_open(os.getpid())
    except OSError:
        return None
    try:
        # Its own session: a terminal's Ctrl-C or a kill of the worker's group must not take
        # the watch down before the worker. No environment (the worker's holds its secrets),
        # -I -S: no site either.
        proc = subprocess.Popen(  # noqa: S603 - this interpreter, this module
            [sys.executable, "-I", "-S", "-c", _RUN, str(pidfd), str(base), suffix],
            cwd="/",
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=(pidfd,),
        )
    except OSError:
        return None
    finally:
        os.close(pidfd)
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], READY_TIMEOUT_S)
    said = proc.stdout.read(1) if ready else b""
    proc.stdout.close()
    if said != b"R":
        proc.kill()
        proc.wait()
        return None
    return proc


def kill_owned(base: Path, suffix: str) -> None:
    """Kill every process of every cgroup under `base` named `*<suffix>`, then remove them."""
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return
    for name in names:
        if name.endswith(suffix):
            _kill(base / name)


def _kill(cgroup: Path) -> None:
    deadline = time.monotonic() + KILL_DEADLINE_S
    has_kill = (cgroup / "cgroup.kill").exists()
    try:
        if has_kill:
            (cgroup / "cgroup.kill").write_text("1")
        while "populated 1" in (cgroup / "cgroup.events").read_text():
            if not has_kill:  # kernels before 5.14: one by one until none is left
                for pid in (cgroup / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)
        cgroup.rmdir()
    except OSError:
        return


def main() -> None:
    """The watch process: argv is the worker's pidfd, the cgroup base and the owner suffix."""
    pidfd, base, suffix = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    os.write(1, b"R")
    os.close(1)
    select.select([pidfd], [], [])  # readable once the worker has exited
    kill_owned(base, suffix)
