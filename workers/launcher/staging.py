"""A job made ready to start: its spec written, its event socket listening, its cgroup open and
its parked interpreter (if any) chosen. `Staged.go()` then starts it: one pipe write to the
spare, or a cold start (exec'd by the worker's waiting stub, `execstub.py`, where it has one:
the stub's cgroup is then the job's; else spawned). A GPU worker stages its reserved next job
while the current one runs, and calls `go()` the moment the current one exits
(`runner.run_job(on_exit=...)`).

What a parked interpreter's start-up (its venv's .pth files, its preloads) might do to these
paths (the spec, the event socket) concerns its own job only: the worker never reads the spec
back, and reads the result through O_NOFOLLOW.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.sandbox import cgroups
from app.sandbox.exceptions import SandboxUnavailable
from workers.launcher import confine, execstub
from workers.launcher.launch import ENTRY, LaunchError, LaunchSpec, start
from workers.launcher.runtime import RuntimeDirError
from workers.launcher.spare import SPARE_READY_TIMEOUT_S, Spare


@dataclass
class Staged:
    """One job, ready to start (`stage`); `go()` starts it, `close()` ends what was staged."""

    job: LaunchSpec
    listener: socket.socket
    cgroup: cgroups.Cgroup | None
    spare: Spare | None
    missed: str | None = None  # why the spare offered could not run it
    proc: subprocess.Popen[bytes] | None = None
    launch: str = "cold"  # "spare": handed to the parked interpreter; "stub": exec'd by one
    stub: execstub.ExecStub | None = None  # this worker's exec stub, taken for a cold start
    started: float = 0.0  # monotonic, at the hand-over or spawn
    started_wall: float | None = None  # the same moment, wall clock

    def go(self) -> subprocess.Popen[bytes]:
        """Start the job (once): hand it to the spare when it is ready for it, else cold."""
        if self.proc is not None:
            return self.proc
        if self.spare is not None:
            why = self.spare.wait_ready(SPARE_READY_TIMEOUT_S)
            if why is None:
                self.started, self.started_wall = time.monotonic(), time.time()
                try:
                    self.proc, self.launch = self.spare.hand_over(self.job, self.cgroup), "spare"
                    # the job's, or the spare's own when the job has none
                    self.cgroup = self.spare.cgroup or self.cgroup
                    return self.proc
                except LaunchError as exc:  # it died just now: start cold instead
                    why = str(exc)
            self.missed = why
            self.spare.close()
            self.spare = None
            if self.cgroup is None and self.job.cgroup is not None:
                self.stub = execstub.take() if takes_stub(self.job) else None
                if self.stub is None:
                    self.cgroup = open_cgroup(self.job)
        self.started, self.started_wall = time.monotonic(), time.time()
        if self.stub is not None:
            stub, self.stub = self.stub, None
            try:
                proc = stub.launch(self.job.command(), self.job.env(), self.job.cwd)
            except BaseException:
                stub.close()  # (a no-op once it became the job)
                raise
            if proc is not None:  # the job runs in the stub's cgroup, from its first instruction
                self.proc, self.cgroup, self.launch = proc, stub.cgroup, "stub"
                return proc
            self.cgroup = open_cgroup(self.job)  # the stub had died: the placed path
            self.started, self.started_wall = time.monotonic(), time.time()
        if self.cgroup is None and self.job.cgroup is not None:
            # A start again after one that failed (the stub taken, then refused): never
            # without the job's cgroup.
            self.cgroup = open_cgroup(self.job)
        try:
            self.proc = start(self.job, self.job.env(), self.cgroup)
        except OSError as exc:
            raise LaunchError(f"cannot start {shlex.join(self.job.command())}: {exc}") from exc
        return self.proc

    def abandon(self) -> None:
        """Kill whatever of it was started and end the staging: for a worker that will not
        run it after all (its loop ended with the job staged)."""
        if self.proc is not None and self.proc.poll() is None:
            confine.signal_group(self.proc.pid, None, signal.SIGKILL)
            confine.signal_group(self.proc.pid, self.cgroup, signal.SIGKILL)
            self.proc.wait()
        self.close()
        if self.cgroup is not None:
            with contextlib.suppress(SandboxUnavailable, OSError):
                self.cgroup.remove()

    def close(self) -> None:
        """Stop listening; an unused spare is killed. (The cgroup is the caller's to remove.)"""
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.job.runtime.events_path)
        if self.spare is not None and self.launch != "spare":
            self.spare.close()
        if self.stub is not None:  # taken, never used
            self.stub.close()
            self.stub = None


def stage(job: LaunchSpec, spare: Spare | None = None) -> Staged:
    """Make `job` ready to start, in `spare` when that can run it (without waiting for it to
    finish its start-up); the spare is used up either way."""
    missed = None
    cgroup: cgroups.Cgroup | None = None
    stub: execstub.ExecStub | None = None
    try:
        if job.argv is None and not ENTRY.match(job.entry):
            raise LaunchError(f"entry {job.entry!r} is not a dotted module name")
        if spare is not None and (missed := spare.fits(job, wait=False)) is not None:
            spare.close()
            spare = None
        parked_in_it = (
            spare is not None and spare.cgroup is not None and spare.cgroup.path.name == job.cgroup
        )
        if spare is None and takes_stub(job):
            stub = execstub.take()  # its cgroup becomes the job's: no process moves at the start
        wants_cgroup = job.cgroup is not None and not parked_in_it and stub is None
        cgroup = open_cgroup(job) if wants_cgroup else None
        job.env()  # built (and kept) now, off the start's path
        _write_spec(job)
        with contextlib.suppress(FileNotFoundError):
            job.result_path.unlink()
        listener = _listen(job.runtime.events_path)
    except BaseException:
        if spare is not None:
            spare.close()
        if stub is not None:
            stub.close()
        if cgroup is not None:
            with contextlib.suppress(SandboxUnavailable, OSError):
                cgroup.remove()
        raise
    return Staged(job=job, listener=listener, cgroup=cgroup, spare=spare, missed=missed, stub=stub)


def takes_stub(job: LaunchSpec) -> bool:
    """Whether a cold start of `job` may be exec'd by the worker's stub (`execstub.py`): an
    unconfined module job that has a cgroup (a sandboxed one starts bwrap in its own, a
    command keeps its spawn)."""
    return job.argv is None and not job.sandboxed and job.cgroup is not None


#: The keys of the experiment protocol's spec, as the harness reads them
#: (`autopilot_harness.protocol.SPEC_KEYS`, which refuses any other key; a unit test keeps the
#: two equal). A job's spec also carries keys for the worker and the judge alone
#: (`head_vs_base`, a command's `baseline_parameters`...): the experiment never sees those.
EXPERIMENT_SPEC_KEYS = frozenset(
    {"experiment", "parameters", "device", "seed", "repeats", "tolerance", "options"}
)


def experiment_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The experiment's view of a job's spec: only the keys of the experiment protocol. The one
    place that decides what of a job's spec reaches the experiment process (spec.json). A spec
    that names no experiment is not a job's (the launcher's own runs) and is written as given."""
    if "experiment" not in spec:
        return dict(spec)
    return {key: value for key, value in spec.items() if key in EXPERIMENT_SPEC_KEYS}


def _write_spec(job: LaunchSpec) -> None:
    """The experiment's spec (`experiment_spec`), written afresh: a parked interpreter's
    start-up (the venv's .pth files, its preloads) runs code that could have left a link at
    that path."""
    with contextlib.suppress(FileNotFoundError):
        job.spec_path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(job.spec_path, flags, 0o644), "w") as handle:
        handle.write(json.dumps(experiment_spec(job.spec)))


def open_cgroup(job: LaunchSpec) -> cgroups.Cgroup | None:
    assert job.cgroup is not None
    try:
        return confine.open_cgroup(job.cgroup, required=job.sandboxed)
    except SandboxUnavailable as exc:
        raise LaunchError(str(exc)) from exc


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
