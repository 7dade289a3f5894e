"""The process runner: one experiment process group, its event socket, its limits, its outcome.

The job runs as `<venv>/bin/python -m <entry>` in its own session and process group with a
scrubbed environment (`environment.py`), under bubblewrap when the host's sandbox is on
(`confine.py`), in a cgroup of its own. It dies with the worker (the death watch kills the
worker's cgroups, `deathwatch.py`; without a cgroup, PR_SET_PDEATHSIG), is
stopped as a whole on timeout (SIGTERM, a grace period, SIGKILL), and whatever it leaves in
its cgroup (or, without one, its group) when it exits is killed, so no grandchild outlives the
job, not even one that called setsid().

With a parked interpreter (`spare.Spare`) the job is handed to it instead of started cold; a
cold start is exec'd by the worker's waiting stub where it has one (`execstub.py`).
How a process is started (`LaunchSpec`, the spawn) is in `launch.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.sandbox import cgroups
from app.sandbox.exceptions import SandboxUnavailable
from workers.launcher import confine
from workers.launcher.launch import LaunchSpec
from workers.launcher.spare import Spare
from workers.launcher.staging import Staged, stage

_READ = 65536
log = logging.getLogger(__name__)

#: Receives each event as it arrives (the queue turns them into heartbeats and progress).
#: An exception raised here stops the job: its group is killed and the exception propagates.
EventCallback = Callable[[dict[str, Any]], None]
#: Receives (pid, pgid) right after the spawn, before any output is read (for the lease).
SpawnCallback = Callable[[int, int], None]
#: Called at each turn of a running job's supervision, on its thread: returns when (monotonic)
#: it wants to be called again at the latest, or None when it does not need to be.
TickCallback = Callable[[], float | None]


@dataclass
class Limits:
    timeout_s: float = 3600.0
    grace_s: float = 10.0
    max_output_bytes: int = 1 << 20  # kept per stream (the tail); the rest is counted
    max_events: int = 10_000  # kept in the outcome; later ones still reach the callback
    max_event_bytes: int = 64 << 10  # one JSON line
    #: all the events kept in the outcome together (JSON lines' bytes): a run that floods its
    #: socket costs its worker at most this (the host's `run_limits.event_bytes`)
    max_events_total_bytes: int = 16 << 20
    max_result_bytes: int = 16 << 20
    drain_s: float = 2.0  # after exit, how long to wait for pipes held by escaped processes
    read_result: bool = True  # False for a command's run: its output is read, not result.json


@dataclass
class Outcome:
    pid: int
    pgid: int
    returncode: int | None
    signal: str | None
    timed_out: bool
    duration_s: float
    result: Any = None
    result_error: str | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    events_dropped: int = 0
    events_malformed: int = 0
    events_kept_bytes: int = 0  # the JSON lines of `events`, together
    events_cap_bytes: int = 0  # what `events_kept_bytes` may reach (`Limits`)
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    #: "spare": handed to a parked interpreter (`Spare`); "stub": started cold by the worker's
    #: exec stub (`execstub.py`), in the stub's cgroup
    launch: str = "cold"
    exited_at: float | None = None  # wall clock: when its leader's exit was seen
    spare_missed: str | None = None  # why a spare offered for this job could not run it
    cgroup: str | None = None  # the name of the cgroup it ran in, if any
    limit: str | None = None  # the cgroup limit it met (`pids.max`, `memory.max`), in words
    unenforced: list[str] = field(default_factory=list)  # limits this host could not set

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.result_error is None

    def notes(self) -> list[str]:
        """What the job's log says of its run besides its output: a limit it met, limits this
        host could not set, events its worker dropped."""
        lines = [f"[limits] {self.limit}"] if self.limit else []
        lines += [f"[limits] not enforced on this host: {why}" for why in self.unenforced]
        if self.events_dropped:
            lines.append(
                f"[events] {self.events_dropped} event(s) dropped, not kept with the outcome: "
                f"its worker kept {len(self.events)} ({self.events_kept_bytes} bytes; the cap "
                f"is {self.events_cap_bytes} bytes, AUTOPILOT_RUN_LIMITS's event_bytes)"
            )
        return lines


class _Tail:
    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.buf = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        self.buf += data
        if len(self.buf) > self.cap:
            del self.buf[: len(self.buf) - self.cap]

    def text(self) -> str:
        return self.buf.decode(errors="replace")


class _Events:
    def __init__(self, limits: Limits, on_event: EventCallback | None) -> None:
        self.limits = limits
        self.on_event = on_event
        self.kept: list[dict[str, Any]] = []
        self.kept_bytes = 0
        self.dropped = 0
        self.malformed = 0

    def feed(self, buf: bytearray, data: bytes, overflow: list[bool]) -> None:
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > self.limits.max_event_bytes:
                    # a line too long to keep: drop what we have and the rest of that line
                    buf.clear()
                    overflow[0] = True
                return
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            if overflow[0] or len(line) > self.limits.max_event_bytes:
                overflow[0] = False
                self.malformed += 1
                continue
            self.line(line)

    def line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            event = json.loads(line)
        except ValueError:
            self.malformed += 1
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            self.malformed += 1
            return
        if (
            len(self.kept) < self.limits.max_events
            and self.kept_bytes + len(line) <= self.limits.max_events_total_bytes
        ):
            self.kept.append(event)
            self.kept_bytes += len(line)
        else:
            self.dropped += 1
        if self.on_event is not None:
            self.on_event(event)


def run_job(
    job: LaunchSpec,
    *,
    limits: Limits | None = None,
    on_event: EventCallback | None = None,
    on_spawn: SpawnCallback | None = None,
    spare: Spare | None = None,
    deferred: Callable[[Callable[[], None]], None] | None = None,
    staged: Staged | None = None,
    on_exit: Callable[[], None] | None = None,
    on_tick: TickCallback | None = None,
) -> Outcome:
    """Run the experiment to completion (or its time limit) and return what happened.

    Must be called from the thread that lives as long as the job: where the job has no
    watched cgroup, PR_SET_PDEATHSIG fires when the spawning *thread* exits. With `spare`,
    the job runs in that parked interpreter when it fits and takes the job
    (`Outcome.launch == "spare"`), else the job starts cold (`Outcome.spare_missed` says
    why); either way the spare is used up. With `deferred`, the job's cgroup (already killed
    when its leader exited) is removed later: `deferred` is given the removal, and a GPU
    worker runs it once the next job has started.

    `staged` is the job made ready ahead (`staging.stage`), perhaps already started
    (`Staged.go`); `on_exit` is called once, as soon as the job's leader has exited and its
    group was killed, before anything else is done about it: a GPU worker starts its next
    job there. `on_tick` is called at each turn while the job runs (`TickCallback`): a GPU
    worker records a reserved job's start there when its first line is slow to come.
    """
    lim = limits or Limits()
    if staged is None:
        staged = stage(job, spare)
    try:
        proc = staged.go()
        outcome = _supervise(
            job,
            proc,
            staged.started,
            staged.listener,
            lim,
            on_event,
            on_spawn,
            staged.cgroup,
            on_exit,
            on_tick,
        )
        outcome.launch, outcome.spare_missed = staged.launch, staged.missed
        outcome.cgroup = staged.cgroup.path.name if staged.cgroup is not None else None
        return outcome
    finally:
        staged.close()
        if staged.cgroup is not None:
            # Whatever the job left, however it detached, goes with its cgroup.
            if deferred is not None:
                deferred(_remover(staged.cgroup))
            else:
                with contextlib.suppress(SandboxUnavailable):
                    staged.cgroup.remove()


def _remover(cgroup: cgroups.Cgroup) -> Callable[[], None]:
    def remove() -> None:
        with contextlib.suppress(SandboxUnavailable, OSError):
            cgroup.remove()

    return remove


def _supervise(
    job: LaunchSpec,
    proc: subprocess.Popen[bytes],
    started: float,
    listener: socket.socket,
    lim: Limits,
    on_event: EventCallback | None,
    on_spawn: SpawnCallback | None,
    cgroup: cgroups.Cgroup | None = None,
    on_exit: Callable[[], None] | None = None,
    on_tick: TickCallback | None = None,
) -> Outcome:
    watch = _Supervision(proc, started, listener, lim, on_event, cgroup, on_exit)
    try:
        if on_spawn is not None:
            on_spawn(proc.pid, watch.pgid)
        watch.register()
        while not watch.over():
            if on_tick is not None and watch.returncode is None:
                watch.tick_at = on_tick()
            for key, _mask in watch.sel.select(watch.timeout()):
                watch.dispatch(key)
    except BaseException:
        watch.kill_group()
        proc.wait()
        raise
    finally:
        watch.close()
    return watch.outcome(job)


class _Supervision:
    """One running job seen from its worker: its pipes, its event socket and its exit in one
    selector, its time limit (SIGTERM, the grace, SIGKILL), and what it left once it exited."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        started: float,
        listener: socket.socket,
        lim: Limits,
        on_event: EventCallback | None,
        cgroup: cgroups.Cgroup | None,
        on_exit: Callable[[], None] | None,
    ) -> None:
        self.proc, self.started, self.listener, self.lim = proc, started, listener, lim
        self.cgroup, self.on_exit = cgroup, on_exit
        self.pgid = proc.pid  # start_new_session: the child leads its own group
        self.sel = selectors.DefaultSelector()
        self.outs = {"stdout": _Tail(lim.max_output_bytes), "stderr": _Tail(lim.max_output_bytes)}
        self.events = _Events(lim, on_event)
        self.pidfd: int | None = None
        self.timed_out = False
        self.returncode: int | None = None
        self.exited_at: float | None = None
        self.deadline = started + lim.timeout_s
        self.kill_at: float | None = None
        self.drain_until: float | None = None
        self.open_streams = 2
        self.now = time.monotonic()
        self.tick_at: float | None = None  # when the caller's tick wants the next turn

    def register(self) -> None:
        proc = self.proc
        assert proc.stdout is not None
        assert proc.stderr is not None
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            self.sel.register(pipe, selectors.EVENT_READ, ("pipe", name))
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(proc.pid)
                self.sel.register(self.pidfd, selectors.EVENT_READ, ("exit", None))

    def over(self) -> bool:
        """One turn's bookkeeping: its exit seen, its time limit enforced; True once it has
        exited and its output is read (or the drain period after the exit is over)."""
        self.now = now = time.monotonic()
        if self.returncode is None:
            self.returncode = self.proc.poll()
            if self.returncode is not None:
                self._exited(now)
        if self.returncode is not None:
            conns = [k for k in self.sel.get_map().values() if k.data[0] == "conn"]
            return (self.open_streams == 0 and not conns) or (
                self.drain_until is not None and now >= self.drain_until
            )
        if self.kill_at is not None and now >= self.kill_at:
            confine.signal_group(self.pgid, self.cgroup, signal.SIGKILL)
            self.kill_at = now + 3600  # sent; now wait for the exit
        elif self.kill_at is None and now >= self.deadline:
            self.timed_out = True
            confine.signal_group(self.pgid, self.cgroup, signal.SIGTERM)
            self.kill_at = now + self.lim.grace_s
        return False

    def _exited(self, now: float) -> None:
        self.exited_at = time.time()
        # the leader is gone: nothing else of the job may stay behind
        confine.signal_group(self.pgid, None, signal.SIGKILL)
        confine.signal_group(self.pgid, self.cgroup, signal.SIGKILL)
        if self.on_exit is not None:
            try:
                self.on_exit()
            except Exception:  # the next job's business, never this one's
                log.warning("the exit callback failed", exc_info=True)
        self.drain_until = now + self.lim.drain_s
        if self.pidfd is not None:
            self.sel.unregister(self.pidfd)
            os.close(self.pidfd)
            self.pidfd = None

    def timeout(self) -> float:
        """How long the selector may wait before the next turn."""
        now = self.now
        wake = [self.deadline if self.kill_at is None else self.kill_at]
        if self.drain_until is not None:
            wake.append(self.drain_until)
        if self.pidfd is None and self.returncode is None:
            wake.append(now + 0.02)  # no pidfd: poll for the exit
        if self.tick_at is not None and self.returncode is None:
            wake.append(self.tick_at)
        if self.returncode is None or self.drain_until:
            return max(0.0, min(wake) - now)
        return 0.0

    def dispatch(self, key: selectors.SelectorKey) -> None:
        kind, data = key.data
        if kind == "exit":
            return  # handled by poll() at the top of the loop
        if kind == "listen":
            with contextlib.suppress(BlockingIOError):
                conn, _ = self.listener.accept()
                conn.setblocking(False)
                self.sel.register(conn, selectors.EVENT_READ, ("conn", (bytearray(), [False])))
            return
        if kind == "pipe":
            self._read_pipe(key, data)
            return
        self._read_events(key, data)

    def _read_pipe(self, key: selectors.SelectorKey, name: str) -> None:
        try:
            chunk = os.read(key.fd, _READ)
        except BlockingIOError:
            return
        if chunk:
            self.outs[name].add(chunk)
        else:
            self.sel.unregister(key.fileobj)
            self.open_streams -= 1

    def _read_events(self, key: selectors.SelectorKey, data: tuple[bytearray, list[bool]]) -> None:
        peer = key.fileobj
        assert isinstance(peer, socket.socket)
        try:
            chunk = peer.recv(_READ)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if chunk:
            self.events.feed(data[0], chunk, data[1])
        else:
            if data[0]:
                self.events.line(bytes(data[0]))  # a last line without its newline
            self.sel.unregister(peer)
            peer.close()

    def kill_group(self) -> None:
        confine.signal_group(self.pgid, None, signal.SIGKILL)
        confine.signal_group(self.pgid, self.cgroup, signal.SIGKILL)

    def close(self) -> None:
        for key in list(self.sel.get_map().values()):
            if key.data[0] == "conn":
                key.fileobj.close()  # type: ignore[union-attr]
        self.sel.close()
        if self.pidfd is not None:
            os.close(self.pidfd)
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()

    def outcome(self, job: LaunchSpec) -> Outcome:
        lim, returncode = self.lim, self.returncode
        duration = time.monotonic() - self.started
        result, result_error = (
            _read_result(job.result_path, returncode, lim.max_result_bytes)
            if lim.read_result
            else (None, None)
        )
        if self.timed_out:
            result_error = f"timed out after {lim.timeout_s:g} s" + (
                f"; {result_error}" if result_error else ""
            )
        limit = self.cgroup.limit_hit() if self.cgroup is not None else None
        if limit is not None:  # whatever it printed or wrote, the run did not run as written
            result_error = limit + (f"; {result_error}" if result_error else "")
        return Outcome(
            pid=self.proc.pid,
            pgid=self.pgid,
            returncode=returncode,
            signal=signal.Signals(-returncode).name
            if returncode is not None and returncode < 0
            else None,
            timed_out=self.timed_out,
            duration_s=duration,
            result=result,
            result_error=result_error,
            events=self.events.kept,
            events_dropped=self.events.dropped,
            events_malformed=self.events.malformed,
            events_kept_bytes=self.events.kept_bytes,
            events_cap_bytes=lim.max_events_total_bytes,
            stdout=self.outs["stdout"].text(),
            stderr=self.outs["stderr"].text(),
            stdout_bytes=self.outs["stdout"].total,
            stderr_bytes=self.outs["stderr"].total,
            exited_at=self.exited_at,
            limit=limit,
            unenforced=list(self.cgroup.unenforced) if self.cgroup is not None else [],
        )


def _read_result(path: Path, returncode: int | None, cap: int) -> tuple[Any, str | None]:
    # The experiment wrote it: never read through a link, a FIFO or a device it left there.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, (
            f"the experiment wrote no result to {path} (exit {returncode}); "
            "it must write JSON to $AUTOPILOT_RESULT"
        )
    except OSError as exc:
        return None, f"result {path} is not a plain file ({exc.strerror})"
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            return None, f"result {path} is not a plain file"
        data = handle.read(cap + 1)
    if len(data) > cap:
        return None, f"result {path} is over the {cap}-byte limit"
    try:
        return json.loads(data), None
    except ValueError as exc:
        return None, f"result {path} is not valid JSON: {exc}"
