"""The bubblewrap command line around one process tree: its namespaces, what it may read, write
and reach (`Policy`), and its environment (complete, never the service's own)."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

BWRAP = "/usr/bin/bwrap"
BASE_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")

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
