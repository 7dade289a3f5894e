"""Confinement for untrusted code (the agent, pip builds, experiments): bubblewrap namespaces
around each process tree, and one cgroup v2 per run that is killed as a whole.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from app.errors import AutopilotError

BWRAP = "/usr/bin/bwrap"
BASE_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
KILL_DEADLINE_S = 5.0

# Only what programs need to resolve names, verify TLS and load libraries: /etc as a whole
# also holds the deploy env files with the service's secrets.
_ETC = (
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "resolv.conf",
    "hosts",
    "host.conf",
    "nsswitch.conf",
    "gai.conf",
    "protocols",
    "services",
    "passwd",
    "group",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "alternatives",
    "mime.types",
)
_ROOT = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_READ_PLAIN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class SandboxUnavailable(AutopilotError):
    status = 503
    slug = "sandbox-unavailable"
    title = "Sandbox unavailable"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}. AUTOPILOT_SANDBOX=off runs untrusted code unconfined (only on a host "
            "whose every user you trust)"
        )


class SandboxTimeout(AutopilotError):
    status = 504
    slug = "sandbox-timeout"
    title = "Sandboxed run timed out"


@dataclass(frozen=True)
class Policy:
    """What one sandboxed process sees. `env` is its complete environment, except HOME (set to
    `home`, else `cwd`, so the service's home never leaks in) and the PWD bwrap adds."""

    cwd: Path
    env: Mapping[str, str]
    read_only: Sequence[Path] = ()
    writable: Sequence[Path] = ()
    devices: Sequence[Path] = ()
    network: bool = False
    symlinks: Sequence[tuple[str, Path]] = ()
    hide: Sequence[Path] = ()
    home: Path | None = None

    def environment(self) -> dict[str, str]:
        return {**self.env, "HOME": str(self.home or self.cwd)}


def allow_env(source: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The variables of `source` named in `names` (those that are set)."""
    return {name: source[name] for name in names if name in source}


@functools.cache
def system_read_only() -> tuple[Path, ...]:
    """What every sandbox may read: the OS, a minimal /etc and the interpreter's base install
    (a venv's python needs it). Looked up once a process: a GPU worker builds a sandbox for
    every job and preflight, and these paths do not come and go under it."""
    paths = [Path("/", name) for name in _ROOT] + [Path("/etc", name) for name in _ETC]
    # Both spellings: a venv's python may link through a symlinked prefix (pyenv's 3.11 -> 3.11.7).
    for base in dict.fromkeys((Path(sys.base_prefix), Path(sys.base_prefix).resolve())):
        if not base.is_relative_to("/usr"):
            paths.append(base)
    return tuple(p for p in paths if p.exists() or p.is_symlink())


@functools.cache
def _system_mounts() -> tuple[tuple[str, ...], tuple[Path, ...]]:
    """bwrap's `--symlink` options for the merged-/usr links at the root, and the rest of
    `system_read_only` to bind read-only."""
    links: list[str] = []
    binds: list[Path] = []
    for path in system_read_only():
        if path.is_symlink() and path.parent == Path("/"):
            links += ["--symlink", os.readlink(path), str(path)]  # merged /usr: /bin -> usr/bin
        else:
            binds.append(path)
    return tuple(links), tuple(binds)


def command(argv: Sequence[str], policy: Policy, *, env_fd: int | None = None) -> list[str]:
    """The bwrap command line that runs `argv` under `policy`. With `env_fd` the environment is
    not on the command line: bwrap reads its `--setenv` options from that fd (`env_args`)."""
    args = [BWRAP, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv"]
    # We run as root: without this the sandbox keeps every capability in its user namespace
    # and can simply remount a read-only bind read-write.
    args += ["--cap-drop", "ALL"]
    if not policy.network:
        args.append("--unshare-net")
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]  # noqa: S108
    links, system = _system_mounts()
    args += links
    binds: list[tuple[str, Path]] = [("--ro-bind-try", path) for path in system]
    binds += [("--ro-bind-try", p) for p in policy.read_only]
    binds += [("--bind", p) for p in policy.writable]
    # Parents before children, so a read-only subdir of a writable dir stays read-only.
    for flag, path in sorted(binds, key=lambda bind: len(bind[1].parts)):
        args += [flag, str(path), str(path)]
    for device in policy.devices:
        args += ["--dev-bind-try", str(device), str(device)]
    for hidden in policy.hide:
        args += ["--tmpfs", str(hidden)]
    for target, link in policy.symlinks:
        args += ["--symlink", target, str(link)]
    # The scratch root too, so only the writable dirs and /tmp take writes.
    args += ["--remount-ro", "/"]
    if env_fd is None:
        for name, value in policy.environment().items():
            args += ["--setenv", name, value]
    else:
        args += ["--args", str(env_fd)]
    return [*args, "--chdir", str(policy.cwd), "--", *argv]


def env_args(policy: Policy) -> int:
    """A memory-only fd holding the `--setenv` options of `policy`, NUL-separated, for bwrap's
    `--args`: an agent's API key is then never on a command line another host user can read."""
    fd = os.memfd_create("bwrap-env", os.MFD_CLOEXEC)
    for name, value in policy.environment().items():
        os.write(fd, b"".join(f"{part}\0".encode() for part in ("--setenv", name, value)))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


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


@functools.cache
def check() -> str | None:
    """None when sandboxes work here; else one line saying what is missing."""
    if not os.access(BWRAP, os.X_OK):
        return (
            f"bubblewrap is not installed ({BWRAP}): `make install` or `apt-get install bubblewrap`"
        )
    probe = command(["/usr/bin/true"], Policy(cwd=Path("/"), env={}))
    try:
        done = subprocess.run(probe, env={}, capture_output=True, text=True, timeout=30)  # noqa: S603
    except subprocess.TimeoutExpired:
        return "bwrap did not finish /usr/bin/true within 30 s"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"bwrap cannot create its namespaces (user namespaces refused?): {why}"
    try:
        Cgroup.create(f"check-{os.getpid()}").remove()
    except SandboxUnavailable as exc:
        return str(exc).partition(". AUTOPILOT_SANDBOX")[0]
    return None


def run(
    argv: Sequence[str],
    policy: Policy,
    *,
    name: str,
    timeout_s: float,
    log_path: Path,
    sandbox: bool = True,
    stdin: Path | None = None,
) -> int:
    """Run `argv` to completion in its own cgroup, confined by `policy` unless `sandbox` is
    False; output to `log_path`, its stdin the file `stdin` (else /dev/null). Nothing it
    started outlives the call."""
    if sandbox and (reason := check()):
        raise SandboxUnavailable(reason)
    cgroup: Cgroup | None = None
    try:
        cgroup = Cgroup.create(name)
    except SandboxUnavailable:
        if sandbox:
            raise
    env_fd: int | None = None
    if sandbox:
        # bwrap gets an empty environment: --clearenv hides it from the child but not from
        # /proc/1/environ inside the sandbox, which shows bwrap's own initial environment.
        env_fd = env_args(policy)
        args, env, cwd = command(argv, policy, env_fd=env_fd), {}, None
    else:
        args, env, cwd = list(argv), policy.environment(), policy.cwd
    try:
        # Never through a link a sandboxed run could have planted where its log goes.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.ExitStack() as files:
            log = files.enter_context(os.fdopen(os.open(log_path, flags, 0o600), "ab"))
            feed = (
                files.enter_context(os.fdopen(os.open(stdin, _READ_PLAIN), "rb"))
                if stdin is not None
                else subprocess.DEVNULL
            )
            proc = subprocess.Popen(  # noqa: S603
                args,
                env=env,
                cwd=cwd,
                stdin=feed,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if env_fd is None else (env_fd,),
                preexec_fn=cgroup.preexec() if cgroup else None,  # noqa: PLW1509
            )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SandboxTimeout(
                f"{argv[0]} ran past its time limit of {timeout_s:g} s and was killed; "
                f"its output is in {log_path}"
            ) from None
        finally:
            if cgroup is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                cgroup.kill()
            proc.wait()
    finally:
        if env_fd is not None:
            os.close(env_fd)
        if cgroup is not None:
            cgroup.remove()
