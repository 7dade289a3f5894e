"""How a job's process is started: its launch spec (venv, entry, cwd, runtime dir, spec), the
environment it gets, its sandbox, and the spawn that makes it a group of its own, in its cgroup,
that dies with the worker.

Shared by the runner (a cold start) and the parked interpreter (`spare.py`), so that both start
an interpreter the same way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.sandbox import bwrap, cgroups
from workers.launcher import confine
from workers.launcher.environment import build_child_env
from workers.launcher.runtime import RuntimeDir
from workers.launcher.venv import interpreter_path

#: A dotted module name: what `-m` runs and what a spare may preload.
ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """The job could not be started; nothing was left running."""


@dataclass(frozen=True)
class LaunchSpec:
    """What to launch: one experiment run of a job, as the runner and a spare see it."""

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
    sandboxed: bool = False  # under bubblewrap (`Settings.sandbox == "on"`)
    network: bool = False  # the host's network inside the sandbox (the experiment's `network`)
    cgroup: str | None = None  # its cgroup's name (`job-<id>`); None: its process group only
    #: A command experiment's run: this argv instead of `python -m <entry>`, run as a script is
    #: from a shell (its own folder on sys.path), and no result.json is read back.
    argv: tuple[str, ...] | None = None

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
        """Exactly the environment the job (and its preflight guard) runs with (a copy)."""
        return dict(self._env)

    @functools.cached_property
    def _env(self) -> dict[str, str]:
        # built once: a hand-over asks for it three times on the GPU's idle gap
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
            safe_path=self.argv is None,
        )

    def tree_path(self) -> list[str]:
        """The module job's tree entries for `sys.path` (PYTHONPATH's, in order)."""
        return [p for p in self.env().get("PYTHONPATH", "").split(os.pathsep) if p]

    def command(self) -> list[str]:
        """What is executed: the module as `python -m <entry>` runs it (`AS_MAIN`), started
        without `site` (`-S`), which `TREE_PATH` runs itself without the tree on `sys.path`,
        then puts the tree first; or the command's argv."""
        if self.argv is not None:
            return list(self.argv)
        return [
            str(self.python),
            "-S",
            "-c",
            AS_MAIN + _AS_MAIN_CALL,
            self.entry,
            *self.tree_path(),
        ]

    def policy(self) -> bwrap.Policy | None:
        """Its sandbox, or None when it runs unconfined."""
        if not self.sandboxed:
            return None
        return confine.policy(
            cwd=self.cwd,
            venv=self.venv,
            env=self.env(),
            network=self.network,
            runtime=self.runtime,
            pythonpath=self.pythonpath,
        )


#: The measurement's own top-level packages (the harness and what it computes with): found
#: outside the job's tree even though the tree comes first on `sys.path`, so that a tree that
#: ships a package of one of these names cannot replace the code that times and checks it
#: (docs/design.md, "Where a number comes from").
MEASUREMENT = ("autopilot_harness", "numpy", "torch")

#: Puts a module job's tree first on `sys.path` only after start-up: a cold start runs without
#: `site` (`-S`), and this runs it (the venv's prefix and site-packages, its .pth files, a
#: `sitecustomize`) with the tree's entries (PYTHONPATH's) taken off `sys.path`, so no
#: `sitecustomize.py`/`usercustomize.py` of the tree runs; a parked interpreter had none on it
#: when it started. Then the tree goes first, PYTHONPATH is set for its children, and a finder
#: looks `MEASUREMENT`'s packages up on `sys.path` without the tree's entries (none found
#: there: the usual search). Used by the cold start (`AS_MAIN`) and the parked interpreter
#: (`spare.py`); it removes its own name from `__main__`.
TREE_PATH = f"""\
def _autopilot_tree_path(tree):
    import sys, _frozen_importlib_external as ext
    sys.modules["__main__"].__dict__.pop("_autopilot_tree_path", None)
    if sys.flags.no_site and "site" not in sys.modules:
        sys.path[:] = [p for p in sys.path if p not in tree]
        import site
        site.main()
    import os
    names = frozenset({MEASUREMENT!r})

    class MeasurementFirst:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if path is not None or name not in names:
                return None
            return ext.PathFinder.find_spec(name, [p for p in sys.path if p not in tree])

    if tree:
        sys.path[0:0] = tree
        os.environ["PYTHONPATH"] = os.pathsep.join(tree)
        sys.meta_path.insert(0, MeasurementFirst)
"""

#: `python -m <entry>` without runpy. For a top-level module that is a source file (what an
#: experiment's entry is), it does what runpy's `_run_module_as_main` does: the import system
#: finds its spec (`sys.meta_path`, as `importlib.util.find_spec` asks), its code runs in
#: `__main__`'s namespace with the same globals (`__name__ == "__main__"`, `__spec__`,
#: `__file__`, ...) and `sys.argv[0]` is its file. Importing runpy (importlib.util,
#: contextlib, collections, functools...) was ~2 ms of a ~13 ms cold start
#: (docs/benchmarks.md). Anything else (a package, a dotted name, a module already imported,
#: none found) goes to runpy itself, errors included. The function removes its own name from
#: `__main__` first; with PYTHONSAFEPATH=1 (every module job), `-c` puts no folder on sys.path,
#: as `-m` puts none. One difference, as for a script: the modules runpy imports are not
#: imported behind the module's back (`import importlib` alone gives no `importlib.util`).
AS_MAIN = (
    TREE_PATH
    + """\
def _autopilot_as_main(entry, tree):
    import sys, _frozen_importlib as boot
    del sys.argv[1:]
    main = sys.modules["__main__"].__dict__
    main.pop("_autopilot_as_main", None)
    _autopilot_tree_path(tree)
    plain = "." not in entry and entry not in sys.modules
    spec = boot._find_spec(entry, None) if plain else None
    loader = getattr(spec, "loader", None)
    if spec is None or spec.submodule_search_locations is not None or not hasattr(
        loader, "get_code"
    ):
        import runpy
        return runpy._run_module_as_main(entry)
    code = loader.get_code(entry)
    sys.argv[0] = spec.origin
    main.update(__name__="__main__", __file__=spec.origin, __cached__=spec.cached,
                __doc__=None, __loader__=loader, __package__=spec.parent, __spec__=spec)
    exec(code, main)
"""
)
#: The call that ends `command()`'s `-c`: its module and its tree's `sys.path` entries are
#: the arguments, taken off argv.
_AS_MAIN_CALL = """\
_autopilot_as_main(__import__("sys").argv[1], __import__("sys").argv[2:])
"""


def _libc_prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def dies_with_parent(
    parent_pid: int,
    sig: signal.Signals = signal.SIGKILL,
    join: Callable[[], None] | None = None,
) -> Callable[[], None]:
    """A preexec_fn: the child gets `sig` when the thread that started it dies (the demo's
    services ask for SIGTERM, so that Celery still shuts down warm); with `join`
    (`Cgroup.preexec()`), it first joins its cgroup, before it execs anything."""

    def setup() -> None:
        if join is not None:
            join()
        # The child dies with its parent; a parent that died before this call is
        # caught by the ppid check (the child was already reparented).
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(125)

    return setup


def killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start(
    job: LaunchSpec, env: dict[str, str], cgroup: cgroups.Cgroup | None
) -> subprocess.Popen[bytes]:
    """Start `job` cold. An unconfined module job in a cgroup its worker's death watch covers
    starts with no preexec_fn, which lets CPython vfork (`_spawn_placed`); every other job (a
    command, a sandboxed job, a host without a writable cgroup v2 or pidfds) starts as before,
    through `spawn`."""
    policy = job.policy()
    if job.argv is None and policy is None and cgroup is not None and confine.watched(cgroup):
        return _spawn_placed(job, env, cgroup)
    return spawn(job.command(), job.cwd, env, subprocess.DEVNULL, policy=policy, cgroup=cgroup)


#: What a placed module job runs before its module: wait until the worker has moved this
#: process into the job's cgroup (one byte on the pipe argv[1]; end of file: the worker died
#: first, so exit before any user code), then become `python -m <argv[2]>` exactly as `-m` does
#: (`AS_MAIN`; its own name is removed from `__main__` first).
_PLACED = (
    AS_MAIN
    + """\
def _autopilot_placed():
    import os, sys
    go, entry, tree = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    del sys.argv[1:]
    placed = os.read(go, 1) == b"G"
    os.close(go)
    if not placed:
        os._exit(125)
    del sys.modules["__main__"].__dict__["_autopilot_placed"]
    _autopilot_as_main(entry, tree)
_autopilot_placed()
"""
)


def _spawn_placed(
    job: LaunchSpec, env: dict[str, str], cgroup: cgroups.Cgroup
) -> subprocess.Popen[bytes]:
    """Start the module job with vfork, then move it into `cgroup` from here while its
    interpreter starts up. The move waits for an RCU grace period in the kernel (5-18 ms here
    when no other move preceded it); done from the parent it overlaps the child's own start
    instead of delaying it. The child runs no code of the job before it is in the cgroup, and
    none at all if the worker died before moving it (the pipe's end of file)."""
    go, ready = os.pipe()
    try:
        proc = subprocess.Popen(  # noqa: S603 - the venv's python and a checked module name
            [str(job.python), "-S", "-c", _PLACED, str(go), job.entry, *job.tree_path()],
            cwd=job.cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # the child leads its own group: pgid == pid
            close_fds=True,
            pass_fds=(go,),
        )
    except BaseException:
        os.close(ready)
        raise
    finally:
        os.close(go)
    try:
        cgroup.add(proc.pid)
        os.write(ready, b"G")
    except OSError:
        killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    finally:
        os.close(ready)
    return proc


def spawn(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    stdin: int,
    pass_fds: Sequence[int] = (),
    *,
    policy: bwrap.Policy | None = None,
    cgroup: cgroups.Cgroup | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv`, under bubblewrap when there is a `policy` (which then holds its cwd and
    environment), in `cgroup` when there is one."""
    run_cwd: Path | None = cwd
    if cgroup is not None:
        confine.watched(cgroup)  # the death watch removes it too if the worker dies
    if policy is not None:
        # bwrap itself gets an empty environment: --clearenv hides it from the job, but the
        # sandbox's pid 1 is bwrap, whose /proc/1/environ the job can read.
        argv, env, run_cwd = bwrap.command(argv, policy), {}, None
    # The preexec_fn makes CPython fork() instead of vfork(): about 3 ms a launch here
    # (bench/launch.py, docs/benchmarks.md); `start` avoids it where it can. Here it joins the
    # cgroup before anything is exec'd and sets the parent-death signal; under bwrap the
    # signal applies to bwrap, whose --die-with-parent takes the sandbox down in turn.
    return subprocess.Popen(  # noqa: S603 - the venv's python and a checked module name
        argv,
        cwd=run_cwd,
        env=env,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the child leads its own group: pgid == pid
        close_fds=True,
        pass_fds=tuple(pass_fds),
        preexec_fn=dies_with_parent(
            os.getpid(), join=cgroup.preexec() if cgroup is not None else None
        ),
    )
