"""The exec stub: a tiny process that waits, in a fresh cgroup of its worker, to become a cold
job (one `execve`), so that a cold launch moves no process between cgroups on its way to the
job's first line.

Moving a process into a cgroup waits for an RCU grace period in the kernel (5-18 ms on a host
without cgroup2's `favordynmods`), longer than the job's interpreter takes to start; a cold job
placed after its spawn waits for it (`launch._spawn_placed`). The stub pays that move ahead: the
worker starts it (its own interpreter, `-I -S`, an empty environment), moves it into
`stub-<n>.w<worker pid>` and keeps it while it is idle or a job runs (`prepare`). At a cold
launch the worker writes the job's argv, environment and cwd to the stub's stdin; the stub execs
exactly that, with that environment only, and its cgroup is the job's from then on: the job's
first instruction runs in it. The cgroup is named for the worker, so the worker's death watch
(`deathwatch.py`) kills it with the worker, and `confine.sweep_orphans` removes what a dead
worker left; the stub also exits at its stdin's end of file (the worker gone or done with it).

One stub per worker process; where none is ready, a cold launch takes the placed path.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.sandbox import cgroups
from app.sandbox.exceptions import SandboxUnavailable
from workers.launcher import confine
from workers.launcher.launch import LaunchError, killpg

log = logging.getLogger(__name__)
#: How long a launch waits for the stub to exec the job (it has its message already).
EXEC_TIMEOUT_S = 10.0

#: What the stub runs (argv[1]: the write end of its status pipe). It restores the signals
#: CPython ignores (as subprocess does for a child: an exec keeps ignored signals ignored),
#: says it is ready ("R"), and reads its launch: its length (10 digits), then cwd, argc, argv
#: and the environment's `NAME=value` entries, NUL-separated (none may hold a NUL); a message
#: cut short (the worker died writing it) is never run. One read in the common case: the job
#: waits for no second wake-up of the stub. It execs the job with that environment only, never
#: its own (CPython may have set LC_CTYPE in it); the status pipe closes on exec, or says why
#: the exec failed ("E<errno>:<what>").
_STUB = """\
import _signal, os
status = int(__import__("sys").argv[1])
os.set_inheritable(status, False)
_signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
null = os.open("/dev/null", os.O_RDONLY)  # the job's stdin (closed on exec)
os.write(status, b"R")
data = os.read(0, 65536)
if not data:
    os._exit(0)
size, data = int(data[:10]), data[10:]
while len(data) < size:
    chunk = os.read(0, size - len(data))
    if not chunk:
        os._exit(125)
    data += chunk
fields = data.split(b"\\0")
argc = int(fields[1])
argv = fields[2 : 2 + argc]
env = dict(kv.split(b"=", 1) for kv in fields[2 + argc :] if kv)
what = b"cwd"
try:
    os.dup2(null, 0)
    os.chdir(fields[0])
    what = b"exec"
    os.execve(argv[0], argv, env)
except OSError as exc:
    os.write(status, b"E%d:%s" % (exc.errno or 0, what))
os._exit(127)
"""


def _message(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> bytes:
    # The cwd made absolute here, where a relative one means what it means to Popen(cwd=...):
    # the stub itself runs in "/".
    where = os.fsencode(os.path.abspath(cwd))
    fields = [where, str(len(argv)).encode(), *map(os.fsencode, argv)]
    fields += [os.fsencode(f"{name}={value}") for name, value in env.items()]
    if any(b"\0" in f for f in fields) or any("=" in name or not name for name in env):
        raise LaunchError("an argument or environment entry of the job holds a NUL or '='")
    body = b"\0".join(fields)
    return b"%010d" % len(body) + body


class ExecStub:
    """One stub: started, moved into its cgroup, waiting for its job (`launch`)."""

    def __init__(self, cgroup: cgroups.Cgroup) -> None:
        self.cgroup: cgroups.Cgroup | None = cgroup
        self.owner = os.getpid()
        self._used = False  # it became a job: its process and cgroup are the job's
        self._ready = False  # it said so ("R", read off its status pipe)
        self._status, status_w = os.pipe()
        try:
            # vfork (no preexec_fn), no environment (the worker's holds its secrets), -I -S: no
            # site, no venv; moved into its cgroup below, before anything is sent to it.
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(  # noqa: S603 - this interpreter
                [sys.executable, "-I", "-S", "-c", _STUB, str(status_w)],
                cwd="/",
                env={},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # the job leads its own group: pgid == pid
                close_fds=True,
                pass_fds=(status_w,),
            )
        except BaseException:
            os.close(self._status)
            raise
        finally:
            os.close(status_w)
        try:
            cgroup.add(self.proc.pid)
        except BaseException:
            self.close()
            raise

    def alive(self) -> bool:
        return self.owner == os.getpid() and self.proc.poll() is None

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the stub's interpreter has started and waits for its job."""
        if self._ready:
            return True
        readable, _, _ = select.select([self._status], [], [], timeout_s)
        self._ready = bool(readable) and os.read(self._status, 1) == b"R"
        return self._ready

    def launch(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path
    ) -> subprocess.Popen[bytes] | None:
        """Make the stub exec `argv` in `cwd` with exactly `env`; returns its process, now the
        job's (whose cgroup is `self.cgroup`), or None when the stub had died first or is stuck
        (it is killed: the caller starts the job another way). An exec that fails raises
        LaunchError."""
        message = _message(argv, env, cwd)
        assert self.proc.stdin is not None
        deadline = time.monotonic() + EXEC_TIMEOUT_S
        stdin = self.proc.stdin.fileno()
        try:
            os.set_blocking(stdin, False)  # a stopped stub must not hang the worker
            sent = 0
            while sent < len(message):  # (one write unless it is over the pipe's 64 KiB)
                _, writable, _ = select.select([], [stdin], [], deadline - time.monotonic())
                if not writable:
                    raise TimeoutError
                sent += os.write(stdin, message[sent:])
            self.proc.stdin.close()
        except (OSError, ValueError):  # gone, or stuck (or the deadline passed): never given
            self.close()  # the job; the caller starts it another way
            return None
        said = b""
        while True:
            left = max(deadline - time.monotonic(), 0.0)
            ready, _, _ = select.select([self._status], [], [], left)
            if not ready:  # stuck before its exec: killed, and the job starts another way
                self.close()
                return None
            chunk = os.read(self._status, 256)
            if not chunk:
                break
            said += chunk
        failed = said.lstrip(b"R")
        if failed:
            self.close()
            raise LaunchError(f"cannot start {shlex.join(argv)}: {_why(failed, cwd)}")
        os.close(self._status)
        self._status, self._used = -1, True
        self.proc.args, self.proc.stdin = list(argv), None  # the job's stdin is /dev/null
        return self.proc

    def close(self) -> None:
        """Kill the stub and remove its cgroup, unless it became a job (idempotent)."""
        if self._used or self.owner != os.getpid():
            return
        if self._status >= 0:
            os.close(self._status)
            self._status = -1
        if self.proc.poll() is None:
            killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            with contextlib.suppress(SandboxUnavailable, OSError):
                cgroup.remove()


def _why(failed: bytes, cwd: Path) -> str:
    if failed.startswith(b"E"):
        code, _, what = failed[1:].partition(b":")
        with contextlib.suppress(ValueError):
            reason = os.strerror(int(code))
            return f"{reason} (its cwd {cwd})" if what == b"cwd" else reason
    return f"the exec stub did not exec it ({failed[:40]!r})"


_lock = threading.Lock()
_waiting: ExecStub | None = None
_names = itertools.count(1)


def prepare() -> bool:
    """Start this worker's next stub unless one waits; True when one waits now. A host without
    a writable cgroup v2 or a death watch (no pidfds) gets none. Called where the worker is
    idle or a job's start is behind it: it spawns a process and waits for a cgroup move."""
    global _waiting
    with _lock:
        if _waiting is not None and _waiting.alive():
            return True
        stale, _waiting = _waiting, None
        if stale is not None and stale.owner == os.getpid():
            stale.close()
        try:
            cgroup = confine.open_cgroup(
                f"stub-{next(_names)}{confine.owner_suffix()}", required=False
            )
        except OSError:
            return False
        if cgroup is None:
            return False
        try:
            if not confine.watched(cgroup):
                cgroup.remove()
                return False
            _waiting = ExecStub(cgroup)
        except (OSError, SandboxUnavailable):
            log.warning("could not start an exec stub for the next cold job", exc_info=True)
            with contextlib.suppress(SandboxUnavailable, OSError):
                cgroup.remove()
            return False
        return True


def take() -> ExecStub | None:
    """This worker's waiting stub, now the caller's to launch or close; None if none waits."""
    global _waiting
    with _lock:
        stub, _waiting = _waiting, None
    if stub is None or stub.owner != os.getpid():
        return None  # (a forked child's copy: the parent's to close)
    if not stub.alive() or stub.cgroup is None or not confine.watched(stub.cgroup):
        stub.close()
        return None
    return stub


def wait_ready(timeout_s: float) -> bool:
    """True once this worker's waiting stub has finished starting (a benchmark waits for it
    as a worker's stub is settled: started while the worker was idle or a job ran)."""
    with _lock:
        stub = _waiting
    return stub is not None and stub.alive() and stub.wait_ready(timeout_s)


def discard() -> None:
    """Kill this worker's waiting stub and remove its cgroup (at the worker's shutdown)."""
    stub = take()
    if stub is not None:
        stub.close()
