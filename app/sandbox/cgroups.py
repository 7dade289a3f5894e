"""One cgroup v2 per run: its limits (processes, memory, CPUs), the limits it met, and its kill:
everything started in it, however it detaches, dies with it."""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from app.sandbox.exceptions import SandboxUnavailable

KILL_DEADLINE_S = 5.0
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def of_deployment(name: str, state_dir: Path) -> str:
    """`name` for a cgroup of this deployment's runs (named for its state dir): two services on
    one host, each with a cycle or job of the same id, never share (and so never kill) one
    another's run's cgroup; a retry within the deployment still takes its crashed run's over."""
    digest = hashlib.sha256(str(state_dir.absolute()).encode()).hexdigest()[:8]
    return f"{name}.d{digest}"


def cgroup_base() -> Path:
    """`autopilot` under our own cgroup on the cgroup2 mount (raises SandboxUnavailable)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, fs = line.partition(" - ")
        if fs.split()[:1] == ["cgroup2"]:
            mount_root, mount_point = fields.split()[3:5]
            break
    else:
        raise SandboxUnavailable("no cgroup v2 is mounted on this host")
    own = next(
        (ln[3:] for ln in Path("/proc/self/cgroup").read_text().splitlines() if ln[:3] == "0::"),
        "/",
    )
    if mount_root != "/" and own.startswith(mount_root):
        own = own[len(mount_root) :]
    return Path(mount_point, own.lstrip("/"), "autopilot")


@dataclass(frozen=True)
class Limits:
    """What one run's cgroup may use: its processes (`pids.max`), its memory (`memory.max`,
    bytes) and its CPUs (`cpu.max`, in CPUs' worth of time); None leaves that one unlimited."""

    pids: int | None = None
    memory: int | None = None
    cpus: float | None = None

    def files(self) -> dict[str, str]:
        """Each limit as the cgroup v2 interface file and the value written to it."""
        cpu = f"{round(self.cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}" if self.cpus else "max"
        wanted = {
            "pids.max": "max" if self.pids is None else str(self.pids),
            "memory.max": "max" if self.memory is None else str(self.memory),
            "cpu.max": cpu,
        }
        if self.memory is not None:
            # the run is one program: on an OOM kill it goes as a whole, not one process of it
            wanted["memory.oom.group"] = "1"
        return wanted


class RunLimits(BaseModel):
    """What one experiment run may use (the `run_limits` setting): the bytes of its events its
    worker keeps (later ones still reach its log and heartbeat), and its cgroup's pids.max,
    memory.max (bytes with an optional K, M or G; a share of the host's RAM, `80%`; or `max`)
    and cpu.max in CPUs; None is unlimited. docs/operations.md, "Untrusted code: the sandbox"."""

    event_bytes: int = Field(default=16 << 20, ge=0)
    pids: int | None = Field(default=4096, ge=16)
    memory: str = Field(default="80%", pattern=r"^(max|[0-9]+[KMG]?|([0-9]{1,2}(\.[0-9]+)?|100)%)$")
    cpus: float | None = Field(default=None, gt=0)


#: The period of `cpu.max`: 100 ms, the kernel's default.
CPU_PERIOD_US = 100_000
#: The counters that say a run met one of its limits: the file, the key, and how to say it.
_LIMIT_EVENTS = (
    ("pids.events", "max", "pids.max", "its process limit: {n} fork(s) refused"),
    ("memory.events", "oom_kill", "memory.max", "its memory limit: {n} process(es) OOM-killed"),
)


@dataclass
class Cgroup:
    """One run's cgroup: everything started in it, however it detaches, dies with it."""

    path: Path
    limits: Limits | None = None
    #: The limits this host could not set, each with why: the run's log says so.
    unenforced: list[str] = field(default_factory=list)
    #: The limit counters when the run started (a cgroup taken over keeps its old counts).
    _counts: dict[str, int] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, name: str, *, base: Path | None = None, limits: Limits | None = None) -> Cgroup:
        """Make (or take over) the cgroup `name`; a crashed run's leftovers in it are killed.
        With `limits`, they are set on it (those this host cannot set: `unenforced`)."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"cgroup name {name!r}: only letters, digits, '_', '.', '-'")
        try:
            parent = base or cgroup_base()
            parent.mkdir(exist_ok=True)
            (parent / name).mkdir(exist_ok=True)
        except OSError as exc:
            raise SandboxUnavailable(f"no writable cgroup v2 here: {exc}") from exc
        cgroup = cls(parent / name)
        cgroup.kill()
        if limits is not None:
            cgroup.apply(limits)
        return cgroup

    def apply(self, limits: Limits) -> None:
        """Set `limits` on this cgroup, enabling their controllers on its parent first. A limit
        this host cannot set (its controller is not delegated to us, or is held by a cgroup v1
        hierarchy) is noted in `unenforced`, never raised: the run is still confined and killed
        as a whole."""
        self.limits, self.unenforced = limits, []
        set_files = set()
        for file, value in limits.files().items():
            controller, why = file.partition(".")[0], None
            if not (self.path / file).exists():
                if value == "max":
                    continue  # unlimited, and its controller off: nothing to enable for it
                why = _enable(self.path.parent, controller)
            if why is None:
                try:
                    _write(self.path / file, value)
                    set_files.add(file)
                    continue
                except OSError as exc:
                    why = f"refused it: {exc.strerror or exc}"
            if value != "max" and file != "memory.oom.group":
                self.unenforced.append(f"{file} = {value} not set: the {controller} {why}")
        self._counts = {
            key: self._count(file, key)
            for file, key, limit, _ in _LIMIT_EVENTS
            if limit in set_files
        }

    def _count(self, file: str, key: str) -> int:
        try:
            for line in (self.path / file).read_text().splitlines():
                name, _, count = line.partition(" ")
                if name == key:
                    return int(count)
        except (OSError, ValueError):
            pass
        return 0

    def limit_hit(self) -> str | None:
        """What limit the run met since its limits were set, in words that name it (`pids.max`,
        `memory.max`); None when it met none (or had none)."""
        values, hits = self.limits.files() if self.limits else {}, []
        for file, key, limit, words in _LIMIT_EVENTS:
            # (only a limit that was set counts)
            if key in self._counts and (n := self._count(file, key) - self._counts[key]) > 0:
                hits.append(f"the run hit {words.format(n=n)} ({limit} = {values[limit]})")
        return "; ".join(hits) or None

    def preexec(self) -> Callable[[], None]:
        """For Popen(preexec_fn=...): the child joins the cgroup before it execs anything."""
        procs = str(self.path / "cgroup.procs")

        def join() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)

        return join

    def add(self, pid: int) -> None:
        """Move the process `pid` into the cgroup (from outside: its own threads come along)."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def populated(self) -> bool:
        try:
            return "populated 1" in (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False

    def kill(self, *, wait: bool = True) -> None:
        """SIGKILL every process in the cgroup and (with `wait`) wait until it is empty.

        Without `wait` the signal is sent and the caller goes on: a job's runner does so when
        the job's leader exits (its pipes' end says when the rest is gone), and removes the
        cgroup, which waits, off the GPU's idle gap."""
        if not self.path.exists():
            return
        deadline = time.monotonic() + KILL_DEADLINE_S
        has_kill = (self.path / "cgroup.kill").exists()
        if has_kill:
            (self.path / "cgroup.kill").write_text("1")
        pause = 0.0005
        while self.populated():
            if not has_kill:  # kernels before 5.14: kill one by one until none is left
                for pid in self.pids():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            if not wait:
                return
            if time.monotonic() > deadline:
                raise SandboxUnavailable(
                    f"cgroup {self.path} still holds {self.pids()} {KILL_DEADLINE_S:g} s "
                    "after it was killed"
                )
            time.sleep(pause)  # the kernel empties it within a few ms: look again soon
            pause = min(pause * 2, 0.01)

    def remove(self) -> None:
        self.kill()
        with contextlib.suppress(FileNotFoundError):
            self.path.rmdir()

    def __enter__(self) -> Cgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@functools.lru_cache(maxsize=64)
def _enable(parent: Path, controller: str) -> str | None:
    """Enable `controller` for `parent`'s children (and above, where a parent lacks it too);
    None once it is, else why not. Tried once a process: delegation does not change under it."""
    chain = [parent]
    while (
        controller not in _words(chain[-1] / "cgroup.controllers")
        and (chain[-1].parent / "cgroup.controllers").exists()  # never above the mount
    ):
        chain.append(chain[-1].parent)
    refused: tuple[Path, OSError] | None = None
    for folder in reversed(chain):
        try:
            _write(folder / "cgroup.subtree_control", f"+{controller}")
        except OSError as exc:
            refused = refused or (folder, exc)
    if controller in _words(parent / "cgroup.subtree_control"):
        return None
    if refused is not None and refused[1].errno == errno.EBUSY:  # no internal processes
        return (
            f"controller cannot be enabled in {refused[0]}: it holds processes of its own "
            "(the worker must run in a leaf of its delegated cgroup)"
        )
    if controller not in _words(chain[-1] / "cgroup.controllers"):
        return (
            f"controller is not available to {parent} (not delegated to this service, or held "
            "by a cgroup v1 hierarchy)"
        )
    return f"controller could not be enabled for the children of {parent}"


def _write(path: Path, value: str) -> None:
    """Write an interface file that exists (never make one, as a plain write would)."""
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _words(path: Path) -> list[str]:
    try:
        return path.read_text().split()
    except OSError:
        return []
