"""The process runner: one experiment process group, its event socket, its limits, its outcome.

The job runs as `<venv>/bin/python -m <entry>` in its own session and process group with a
scrubbed environment (`environment.py`). It dies with the worker (PR_SET_PDEATHSIG), is
stopped as a whole group on timeout (SIGTERM, a grace period, SIGKILL), and whatever it
leaves in its group when it exits is killed, so no grandchild outlives the job.

A worker that runs jobs back to back can start the next job's interpreter ahead of time
(`Spare`): the venv's python, started with the job environment it will have, parked before
any user code until it is handed a job. Handing over costs a pipe write instead of a process
start (`site`, the venv's `.pth` files: 35-70 ms on a GPU worker, idle GPU time).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import select
import selectors
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.launcher.environment import build_child_env
from workers.launcher.runtime import RuntimeDir, RuntimeDirError
from workers.launcher.venv import interpreter_path

_ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PR_SET_PDEATHSIG = 1
_READ = 65536

#: Receives each event as it arrives (the queue turns them into heartbeats and progress).
#: An exception raised here stops the job: its group is killed and the exception propagates.
EventCallback = Callable[[dict[str, Any]], None]
#: Receives (pid, pgid) right after the spawn, before any output is read (for the lease).
SpawnCallback = Callable[[int, int], None]


class LaunchError(RuntimeError):
    """The job could not be started; nothing was left running."""


@dataclass(frozen=True)
class Job:
    venv: Path
    entry: str  # the module run with `-m`
    cwd: Path
    runtime: RuntimeDir
    spec: Mapping[str, Any]
    cuda_visible_devices: str | None = None
    pythonpath: Sequence[Path] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)
    base_env: Mapping[str, str] = field(default_factory=dict)  # the worker's env to filter
    requirements_hash: str | None = None

    @property
    def python(self) -> Path:
        return interpreter_path(self.venv)

    @property
    def spec_path(self) -> Path:
        return self.runtime.path / "spec.json"

    @property
    def result_path(self) -> Path:
        return self.runtime.path / "result.json"

    def env(self) -> dict[str, str]:
        """Exactly the environment the job (and its preflight guard) runs with."""
        return build_child_env(
            base_env=self.base_env,
            venv=self.venv,
            runtime_dir=self.runtime.path,
            events_path=self.runtime.events_path,
            result_path=self.result_path,
            spec_path=self.spec_path,
            cuda_visible_devices=self.cuda_visible_devices,
            pythonpath=self.pythonpath,
            requirements_hash=self.requirements_hash,
            extra=self.extra_env,
        )


@dataclass
class Limits:
    timeout_s: float = 3600.0
    grace_s: float = 10.0
    max_output_bytes: int = 1 << 20  # kept per stream (the tail); the rest is counted
    max_events: int = 10_000  # kept in the outcome; later ones still reach the callback
    max_event_bytes: int = 64 << 10  # one JSON line
    max_result_bytes: int = 16 << 20
    drain_s: float = 2.0  # after exit, how long to wait for pipes held by escaped processes


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
    stdout: str = ""
    stderr: str = ""
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    launch: str = "cold"  # "spare": handed to a parked interpreter (`Spare`)
    spare_missed: str | None = None  # why a spare offered for this job could not run it

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and self.result_error is None


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
        if len(self.kept) < self.limits.max_events:
            self.kept.append(event)
        else:
            self.dropped += 1
        if self.on_event is not None:
            self.on_event(event)


def _libc_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def _child_setup(parent_pid: int) -> Callable[[], None]:
    def setup() -> None:
        # The job dies with the worker process; a worker that died before this call is
        # caught by the ppid check (the child was already reparented).
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(125)

    return setup


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _listen(path: Path) -> socket.socket:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(16)
    except OSError as exc:
        sock.close()
        raise RuntimeDirError(
            f"cannot listen on the event socket {path} ({len(os.fsencode(str(path)))} bytes): "
            f"{exc}; the runtime dir must come from allocate_runtime"
        ) from exc
    sock.setblocking(False)
    return sock


def _spawn(
    argv: list[str], cwd: Path, env: dict[str, str], stdin: int, pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    # The preexec_fn makes CPython fork() instead of vfork(): about 3-5 ms a launch here
    # (bench/launch.py, docs/benchmarks.md). Exec'ing util-linux `setpriv --pdeathsig` instead
    # measured no better (an extra exec), so the job's death with the worker is kept this way.
    return subprocess.Popen(  # noqa: S603 - the venv's python and a checked module name
        argv,
        cwd=cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the child leads its own group: pgid == pid
        close_fds=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=_child_setup(os.getpid()),
    )


#: What a parked interpreter runs: wait for one line (the job), then become `python -m entry`
#: exactly as runpy does for `-m` (`__main__`, `sys.argv[0]`, `__spec__`), with the job's own
#: cwd, `sys.path` entries (PYTHONPATH's place: first, as PYTHONSAFEPATH adds no script dir)
#: and per-job variables. Its own name is removed from `__main__` before the module runs.
#: `runpy` (which `-m` imports anyway) and `json` are imported while parked, and so are the
#: project's `preload` modules (argv; from the venv only: no job path is on `sys.path` yet);
#: then it says it is ready on a pipe of its own (argv[1]) and waits for its job.
_PARK = """\
def _autopilot_park():
    import json, os, runpy, sys
    ready, preload = int(sys.argv[1]), sys.argv[2:]
    del sys.argv[1:]
    try:
        for name in preload:
            __import__(name)
    except BaseException:
        import traceback
        traceback.print_exc()
        os._exit(3)
    os.write(ready, b"R")
    os.close(ready)
    line = sys.stdin.buffer.readline()
    if not line:
        raise SystemExit(0)
    go = json.loads(line)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name in go["unset"]:
        os.environ.pop(name, None)
    os.environ.update(go["set"])
    os.chdir(go["cwd"])
    sys.path[0:0] = go["path"]
    del sys.modules["__main__"].__dict__["_autopilot_park"]
    runpy._run_module_as_main(go["entry"])
_autopilot_park()
"""

#: Variables a parked interpreter takes at hand-over. Every other variable must be the same in
#: the spare and the job, because the interpreter or the loader reads it only at start-up.
_HANDED_OVER = frozenset(
    {
        "PYTHONPATH",
        "AUTOPILOT_SPEC",
        "AUTOPILOT_EVENTS",
        "AUTOPILOT_RESULT",
        "AUTOPILOT_REQUIREMENTS_HASH",
    }
)


#: How long a job waits for a spare still importing its preloads before starting cold.
SPARE_READY_TIMEOUT_S = 60.0


def _venv_stamp(venv: Path) -> tuple[int, int]:
    st = os.stat(os.path.join(os.path.abspath(venv), "pyvenv.cfg"))
    return st.st_ino, st.st_mtime_ns


class Spare:
    """A venv's interpreter started ahead of its job, parked before any user code.

    Create it from the thread that will run the job (PR_SET_PDEATHSIG follows the spawning
    thread). It holds its runtime dir, whose paths are in its environment: the job it runs
    must use that runtime dir. `run_job(job, spare=...)` takes ownership; `close()` kills an
    unused one (the caller releases the runtime dir).
    """

    def __init__(
        self,
        *,
        venv: Path,
        runtime: RuntimeDir,
        cuda_visible_devices: str | None = None,
        base_env: Mapping[str, str] | None = None,
        extra_env: Mapping[str, str] | None = None,
        requirements_hash: str | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        bad = [name for name in preload if not _ENTRY.match(name)]
        if bad:
            raise LaunchError(f"preload {bad[0]!r} is not a dotted module name")
        self.venv = venv
        self.runtime = runtime
        self.preload = tuple(preload)
        self._stamp = _venv_stamp(venv)
        template = Job(
            venv=venv,
            entry="_",
            cwd=runtime.path,
            runtime=runtime,
            spec={},
            cuda_visible_devices=cuda_visible_devices,
            extra_env=dict(extra_env or {}),
            base_env=dict(base_env or {}),
            requirements_hash=requirements_hash,
        )
        self.env = template.env()
        python = template.python
        self.started_at = time.monotonic()
        self._ready = False
        self._ready_fd, ready_w = os.pipe()
        try:
            self.proc: subprocess.Popen[bytes] = _spawn(
                [str(python), "-c", _PARK, str(ready_w), *self.preload],
                runtime.path,
                self.env,
                subprocess.PIPE,
                pass_fds=(ready_w,),
            )
        except OSError as exc:
            os.close(self._ready_fd)
            raise LaunchError(f"cannot start a spare {python}: {exc}") from exc
        finally:
            os.close(ready_w)

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the spare has imported its preloads and waits for a job; else why not.

        A spare still importing is waited for (it is ahead of a cold start, which would import
        the same); one whose preload failed has exited without saying it was ready."""
        if self._ready:
            return None
        readable, _, _ = select.select([self._ready_fd], [], [], timeout_s)
        if not readable:
            return f"the spare was not ready within {timeout_s:g} s"
        if os.read(self._ready_fd, 1) != b"R":
            return f"the spare exited before it was ready ({self.proc.wait()})"
        self._ready = True
        return None

    def fits(self, job: Job) -> str | None:
        """None when this spare can run `job`; otherwise why not."""
        if self.proc.poll() is not None:
            return f"the spare exited ({self.proc.returncode})"
        if os.path.abspath(job.venv) != os.path.abspath(self.venv):
            return "another venv"
        if job.runtime.path != self.runtime.path:
            return "another runtime dir"
        try:
            if _venv_stamp(job.venv) != self._stamp:
                return "the venv changed since the spare started"
        except OSError:
            return "the venv is gone"
        wanted = job.env()
        for name in (set(wanted) | set(self.env)) - _HANDED_OVER:
            if wanted.get(name) != self.env.get(name):
                return f"{name} differs (read at interpreter start)"
        for top in sorted({name.split(".")[0] for name in self.preload}):
            for entry in job.pythonpath:
                if (Path(entry) / top).exists() or (Path(entry) / f"{top}.py").exists():
                    return f"the job's {entry} has its own {top!r}, which the spare preloaded"
        return self.wait_ready(SPARE_READY_TIMEOUT_S)

    def hand_over(self, job: Job) -> subprocess.Popen[bytes]:
        wanted = job.env()
        go = {
            "entry": job.entry,
            "cwd": os.path.abspath(job.cwd),
            "path": [p for p in wanted.get("PYTHONPATH", "").split(os.pathsep) if p],
            "set": {k: v for k, v in wanted.items() if k in _HANDED_OVER},
            "unset": sorted(k for k in _HANDED_OVER if k not in wanted),
        }
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(go).encode() + b"\n")
            self.proc.stdin.close()
        except OSError as exc:
            self.close()
            raise LaunchError(f"cannot hand the job to the spare interpreter: {exc}") from exc
        return self.proc

    def close(self) -> None:
        """Kill the spare's group if it never got a job (idempotent)."""
        if self.proc.returncode is None and self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self._ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._ready_fd)
            self._ready_fd = -1


def run_job(
    job: Job,
    *,
    limits: Limits | None = None,
    on_event: EventCallback | None = None,
    on_spawn: SpawnCallback | None = None,
    spare: Spare | None = None,
) -> Outcome:
    """Run the experiment to completion (or its time limit) and return what happened.

    Must be called from the thread that lives as long as the job: PR_SET_PDEATHSIG fires
    when the spawning *thread* exits. With `spare`, the job runs in that parked interpreter
    when it fits and takes the job (`Outcome.launch == "spare"`), else the job starts cold
    (`Outcome.spare_missed` says why); either way the spare is used up.
    """
    lim = limits or Limits()
    launch, missed = "cold", None
    try:
        if not _ENTRY.match(job.entry):
            raise LaunchError(f"entry {job.entry!r} is not a dotted module name")
        if spare is not None and (missed := spare.fits(job)) is not None:
            spare.close()
            spare = None
        env = job.env()
        job.spec_path.write_text(json.dumps(dict(job.spec)))
        with contextlib.suppress(FileNotFoundError):
            job.result_path.unlink()
        listener = _listen(job.runtime.events_path)
        try:
            started = time.monotonic()
            proc: subprocess.Popen[bytes] | None = None
            if spare is not None:
                try:
                    proc, launch = spare.hand_over(job), "spare"
                except LaunchError as exc:  # it died just now: start cold instead
                    missed, started = str(exc), time.monotonic()
            if proc is None:
                try:
                    proc = _spawn(
                        [str(job.python), "-m", job.entry], job.cwd, env, subprocess.DEVNULL
                    )
                except OSError as exc:
                    raise LaunchError(f"cannot start {job.python} -m {job.entry}: {exc}") from exc
            outcome = _supervise(job, proc, started, listener, lim, on_event, on_spawn)
            outcome.launch, outcome.spare_missed = launch, missed
            return outcome
        finally:
            listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(job.runtime.events_path)
    finally:
        if spare is not None and launch != "spare":
            spare.close()


def _supervise(
    job: Job,
    proc: subprocess.Popen[bytes],
    started: float,
    listener: socket.socket,
    lim: Limits,
    on_event: EventCallback | None,
    on_spawn: SpawnCallback | None,
) -> Outcome:
    pgid = proc.pid  # start_new_session: the child leads its own group
    sel = selectors.DefaultSelector()
    outs = {"stdout": _Tail(lim.max_output_bytes), "stderr": _Tail(lim.max_output_bytes)}
    events = _Events(lim, on_event)
    pidfd: int | None = None
    timed_out = False
    returncode: int | None = None
    try:
        if on_spawn is not None:
            on_spawn(proc.pid, pgid)
        assert proc.stdout is not None
        assert proc.stderr is not None
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            os.set_blocking(pipe.fileno(), False)
            sel.register(pipe, selectors.EVENT_READ, ("pipe", name))
        sel.register(listener, selectors.EVENT_READ, ("listen", None))
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(proc.pid)
                sel.register(pidfd, selectors.EVENT_READ, ("exit", None))
        deadline = started + lim.timeout_s
        kill_at: float | None = None
        drain_until: float | None = None
        open_streams = 2
        while True:
            now = time.monotonic()
            if returncode is None:
                returncode = proc.poll()
                if returncode is not None:
                    # the leader is gone: nothing else of the job may stay behind
                    _killpg(pgid, signal.SIGKILL)
                    drain_until = now + lim.drain_s
                    if pidfd is not None:
                        sel.unregister(pidfd)
                        os.close(pidfd)
                        pidfd = None
            if returncode is not None:
                conns = [k for k in sel.get_map().values() if k.data[0] == "conn"]
                if (open_streams == 0 and not conns) or (
                    drain_until is not None and now >= drain_until
                ):
                    break
            elif kill_at is not None and now >= kill_at:
                _killpg(pgid, signal.SIGKILL)
                kill_at = now + 3600  # sent; now wait for the exit
            elif kill_at is None and now >= deadline:
                timed_out = True
                _killpg(pgid, signal.SIGTERM)
                kill_at = now + lim.grace_s
            wake = [deadline if kill_at is None else kill_at]
            if drain_until is not None:
                wake.append(drain_until)
            if pidfd is None and returncode is None:
                wake.append(now + 0.02)  # no pidfd: poll for the exit
            timeout = max(0.0, min(wake) - now) if returncode is None or drain_until else 0.0
            for key, _mask in sel.select(timeout):
                kind, data = key.data
                if kind == "exit":
                    continue  # handled by poll() at the top of the loop
                if kind == "listen":
                    with contextlib.suppress(BlockingIOError):
                        conn, _ = listener.accept()
                        conn.setblocking(False)
                        sel.register(conn, selectors.EVENT_READ, ("conn", (bytearray(), [False])))
                    continue
                if kind == "pipe":
                    try:
                        chunk = os.read(key.fd, _READ)
                    except BlockingIOError:
                        continue
                    if chunk:
                        outs[data].add(chunk)
                    else:
                        sel.unregister(key.fileobj)
                        open_streams -= 1
                    continue
                peer = key.fileobj
                assert isinstance(peer, socket.socket)
                try:
                    chunk = peer.recv(_READ)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if chunk:
                    events.feed(data[0], chunk, data[1])
                else:
                    if data[0]:
                        events.line(bytes(data[0]))  # a last line without its newline
                    sel.unregister(peer)
                    peer.close()
    except BaseException:
        _killpg(pgid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        for key in list(sel.get_map().values()):
            if key.data[0] == "conn":
                key.fileobj.close()  # type: ignore[union-attr]
        sel.close()
        if pidfd is not None:
            os.close(pidfd)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        proc.stderr.close()
    duration = time.monotonic() - started
    result, result_error = _read_result(job.result_path, returncode, lim.max_result_bytes)
    if timed_out:
        result_error = f"timed out after {lim.timeout_s:g} s" + (
            f"; {result_error}" if result_error else ""
        )
    return Outcome(
        pid=proc.pid,
        pgid=pgid,
        returncode=returncode,
        signal=signal.Signals(-returncode).name
        if returncode is not None and returncode < 0
        else None,
        timed_out=timed_out,
        duration_s=duration,
        result=result,
        result_error=result_error,
        events=events.kept,
        events_dropped=events.dropped,
        events_malformed=events.malformed,
        stdout=outs["stdout"].text(),
        stderr=outs["stderr"].text(),
        stdout_bytes=outs["stdout"].total,
        stderr_bytes=outs["stderr"].total,
    )


def _read_result(path: Path, returncode: int | None, cap: int) -> tuple[Any, str | None]:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None, (
            f"the experiment wrote no result to {path} (exit {returncode}); "
            "it must write JSON to $AUTOPILOT_RESULT"
        )
    if size > cap:
        return None, f"result {path} is {size} bytes, over the {cap}-byte limit"
    try:
        return json.loads(path.read_bytes()), None
    except ValueError as exc:
        return None, f"result {path} is not valid JSON: {exc}"
