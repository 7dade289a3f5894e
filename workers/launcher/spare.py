"""The parked interpreter (`Spare`): a venv's python started ahead of its job.

A worker that runs jobs back to back can start the next job's interpreter ahead of time: the
venv's python, started with the job environment it will have, parked before any user code
until it is handed a job. Handing over costs a pipe write instead of a process start (`site`,
the venv's `.pth` files: 35-70 ms on a GPU worker, idle GPU time).

Under the sandbox the spare's bubblewrap is set up for the job it was started for: it binds
that job's clean export, so it serves that job only (any other starts cold). It waits in a
cgroup of its own; at hand-over its processes move into the job's cgroup (`job-<id>`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from app.sandbox import cgroups
from app.sandbox.exceptions import SandboxUnavailable
from workers.launcher import confine, runtime
from workers.launcher.launch import ENTRY, TREE_PATH, LaunchError, LaunchSpec, killpg, spawn
from workers.launcher.runtime import RuntimeDir

log = logging.getLogger(__name__)
#: A parked interpreter older than this is not used (nor kept): the next job starts cold.
SPARE_MAX_IDLE_S = 1800.0

#: What a parked interpreter runs: wait for one line (the job), then become `python -m entry`
#: exactly as runpy does for `-m` (`__main__`, `sys.argv[0]`, `__spec__`), with the job's own
#: cwd, `sys.path` entries (PYTHONPATH's place: first, as PYTHONSAFEPATH adds no script dir,
#: put there by `launch.TREE_PATH`, as for a cold start) and per-job variables. Its own name
#: is removed from `__main__` before the module runs.
#: `runpy` (which `-m` imports anyway) and `json` are imported while parked, and so are the
#: project's `preload` modules (argv; from the venv only: no job path is on `sys.path` yet);
#: then it says it is ready on a pipe of its own (argv[1]) and waits for its job.
_PARK = (
    TREE_PATH
    + """\
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
    del sys.modules["__main__"].__dict__["_autopilot_park"]
    _autopilot_tree_path(go["path"])
    runpy._run_module_as_main(go["entry"])
_autopilot_park()
"""
)

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
    must use that runtime dir. `sandboxed`, it runs in the sandbox its job will have, which
    binds `workdir` (that job's export): a job elsewhere does not fit. `run_job(job,
    spare=...)` takes ownership; `close()` kills an unused one (the caller releases the
    runtime dir).
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
        sandboxed: bool = False,
        network: bool = False,
        workdir: Path | None = None,
        cgroup_name: str | None = None,
    ) -> None:
        bad = [name for name in preload if not ENTRY.match(name)]
        if bad:
            raise LaunchError(f"preload {bad[0]!r} is not a dotted module name")
        if sandboxed and workdir is None:
            raise LaunchError("a sandboxed spare needs the workdir (export) of its job")
        self.venv = venv
        self.runtime = runtime
        self.preload = tuple(preload)
        self.sandboxed, self.network = sandboxed, network
        self.workdir = Path(os.path.abspath(workdir)) if workdir is not None else None
        self._stamp = _venv_stamp(venv)
        self._handed = False
        template = LaunchSpec(
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
        policy = None
        if sandboxed:
            assert self.workdir is not None
            policy = confine.policy(
                cwd=self.workdir, venv=venv, env=self.env, network=network, runtime=runtime
            )
        try:
            # Parked in the cgroup of the job it is for when that job is known: handing it over
            # then moves no process (a move into a new cgroup costs ~15 ms here, on the GPU's
            # idle gap); else named for its runtime dir (unique on the host).
            self.cgroup = confine.open_cgroup(
                cgroup_name or confine.spare_cgroup_name(runtime.target.name),
                required=sandboxed,
            )
        except SandboxUnavailable as exc:
            raise LaunchError(str(exc)) from exc
        self.started_at = time.monotonic()
        self._ready = False
        self._ready_fd, ready_w = os.pipe()
        try:
            self.proc: subprocess.Popen[bytes] = spawn(
                [str(python), "-c", _PARK, str(ready_w), *self.preload],
                runtime.path,
                self.env,
                subprocess.PIPE,
                pass_fds=(ready_w,),
                policy=policy,
                cgroup=self.cgroup,
            )
        except OSError as exc:
            os.close(self._ready_fd)
            self._remove_cgroup()
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

    def fits(self, job: LaunchSpec, *, wait: bool = True) -> str | None:
        """None when this spare can run `job`; otherwise why not. Without `wait`, a spare
        still importing its preloads fits too (`wait_ready` before the hand-over)."""
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
        if job.sandboxed != self.sandboxed:
            return "the sandbox setting differs"
        if self.sandboxed:
            assert self.workdir is not None
            if Path(os.path.abspath(job.cwd)) != self.workdir:
                return "another export (the spare's sandbox binds the one of the job it was for)"
            inside = self.workdir
            outside = [
                p for p in job.pythonpath if not Path(os.path.abspath(p)).is_relative_to(inside)
            ]
            if outside:
                return f"the job's {outside[0]} is outside the spare's sandbox"
            if job.network != self.network:
                return "another network setting"
        wanted = job.env()
        for name in (set(wanted) | set(self.env)) - _HANDED_OVER:
            if wanted.get(name) != self.env.get(name):
                return f"{name} differs (read at interpreter start)"
        for top in sorted({name.split(".")[0] for name in self.preload}):
            for entry in job.pythonpath:
                if (Path(entry) / top).exists() or (Path(entry) / f"{top}.py").exists():
                    return f"the job's {entry} has its own {top!r}, which the spare preloaded"
        return self.wait_ready(SPARE_READY_TIMEOUT_S) if wait else None

    def hand_over(
        self, job: LaunchSpec, cgroup: cgroups.Cgroup | None = None
    ) -> subprocess.Popen[bytes]:
        """Give the spare `job`; with `cgroup` (the job's), its processes move there first, so
        that whatever the job starts is in it. `self.cgroup` is then the job's cgroup."""
        if cgroup is not None and self.cgroup is not None and cgroup.path != self.cgroup.path:
            try:
                confine.move(self.cgroup, cgroup)
            except OSError as exc:
                self.close()
                raise LaunchError(f"cannot move the spare into {cgroup.path}: {exc}") from exc
            self.cgroup = cgroup
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
            if cgroup is not None and self.cgroup is cgroup:
                self.cgroup = None  # the job's own: the cold start goes there
            self.close()
            raise LaunchError(f"cannot hand the job to the spare interpreter: {exc}") from exc
        self._handed = True
        return self.proc

    def close(self) -> None:
        """Kill the spare's group (and cgroup) if it never got a job (idempotent)."""
        if self.proc.returncode is None and self.proc.poll() is None:
            killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if not self._handed:
            self._remove_cgroup()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        if self._ready_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._ready_fd)
            self._ready_fd = -1

    def _remove_cgroup(self) -> None:
        cgroup, self.cgroup = self.cgroup, None
        if cgroup is not None:
            with contextlib.suppress(SandboxUnavailable, OSError):
                cgroup.remove()


class SpareSlot:
    """At most one parked interpreter (`Spare`) per GPU worker, for its next job.

    It is started while a job runs (once the job's user code has begun, so it costs that job
    nothing at its own start) for the same venv and environment, and handed the next job if
    that job fits; the GPU then waits for a pipe write instead of an interpreter start. It
    lives in the worker process across doorbells; all of it runs on the worker's main thread
    (PR_SET_PDEATHSIG follows the spawning thread, so a spare dies with its worker).
    """

    def __init__(self) -> None:
        self.spare: Spare | None = None
        self._swept = False

    def discard(self) -> None:
        """Close the parked spare, if any (the next job runs no interpreter of ours)."""
        spare, self.spare = self.spare, None
        if spare is not None:
            self._discard(spare)

    def take(
        self,
        *,
        venv: str,
        suffix_len: int,
        preload: tuple[str, ...],
        workdir: str | None = None,
        network: bool = False,
    ) -> Spare | None:
        """The spare if it can serve a job of this venv, socket budget and preload (and, when
        sandboxed, of this workdir and network setting), else None (closed)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if time.monotonic() - spare.started_at > SPARE_MAX_IDLE_S:
            self._discard(spare)  # parked for long: the venv or its files may have moved on
            return None
        if (
            os.path.abspath(spare.venv) == os.path.abspath(venv)
            and spare.runtime.suffix_len >= suffix_len
            and spare.preload == preload
            and (
                not spare.sandboxed
                or (
                    workdir is not None
                    and spare.workdir == Path(os.path.abspath(workdir))
                    and spare.network == network
                )
            )
        ):
            return spare
        self._discard(spare)
        return None

    def prestart(
        self,
        *,
        state_dir: Path,
        venv: str,
        suffix_len: int,
        requirements_hash: str | None,
        preload: tuple[str, ...],
        cuda_visible_devices: str | None,
        sandboxed: bool = False,
        network: bool = False,
        workdir: str | None = None,
        cgroup_name: str | None = None,
    ) -> None:
        if self.spare is not None:
            return
        if not self._swept:
            self._swept = True
            confine.sweep_orphans()  # what the jobs and spares of a dead worker left here
        rt: RuntimeDir | None = None
        try:
            rt = runtime.allocate_runtime(
                state_dir=state_dir, env=os.environ, suffix_len=suffix_len
            )
            self.spare = Spare(
                venv=Path(venv),
                runtime=rt,
                cuda_visible_devices=cuda_visible_devices,
                base_env=dict(os.environ),
                requirements_hash=requirements_hash,
                preload=preload,
                sandboxed=sandboxed,
                network=network,
                workdir=Path(workdir) if workdir is not None else None,
                cgroup_name=cgroup_name,
            )
        except Exception:  # an optimisation only: the next job starts cold
            log.warning("could not park an interpreter for the next job", exc_info=True)
            if rt is not None:
                with contextlib.suppress(Exception):
                    runtime.release_runtime(rt)

    def close(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            self._discard(spare)

    @staticmethod
    def _discard(spare: Spare) -> None:
        spare.close()
        with contextlib.suppress(Exception):
            runtime.release_runtime(spare.runtime)
