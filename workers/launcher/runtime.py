"""The job's private runtime dir, chosen so every Unix socket path in it fits `sun_path`.

docs/design.md, "Budget Unix socket paths on the final path": the budget is counted on the *final*
path (the dir, each socket the
runner makes, and what the job's libraries append), and when the short candidate is
mounted noexec a short alias links to an owner-only target on an exec-capable filesystem.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Bytes of `sun_path` usable for a path (the rest is the terminating NUL).
SUN_PATH_MAX = 103 if sys.platform == "darwin" else 107
#: The Unix sockets the runner itself creates in the runtime dir.
EVENTS_SOCKET = "ev.sock"
RUNNER_SOCKETS: tuple[str, ...] = (EVENTS_SOCKET,)
#: What the job's libraries append to TMPDIR for their own sockets (torch, multiprocessing's
#: `pymp-XXXXXXXX/listener-XXXXXXXX` is 33 bytes), counted with the separator.
DEFAULT_SUFFIX_LEN = 40
DIR_PREFIX = "ap-"
_RANDOM_LEN = 8  # tempfile.mkdtemp's random part


class RuntimeDirError(RuntimeError):
    """No candidate gives a runtime dir whose socket paths fit; the message lists why."""


class AliasError(RuntimeDirError):
    """An alias failed verification: it is not exactly our link to our owner-only target."""


@dataclass(frozen=True)
class Candidate:
    source: str  # "AUTOPILOT_RUNTIME_ROOT", "TMPDIR", "/tmp", "/dev/shm", "state dir", "given"
    root: str
    final_len: int  # the longest final socket path a runtime dir here would have
    usable: bool
    fits: bool
    exec_ok: bool
    reason: str | None  # why it was passed over; None for the chosen one or when not reached


@dataclass(frozen=True)
class Alias:
    path: Path  # the short symlink the job sees
    target: Path  # the owner-only directory it points at


@dataclass
class RuntimeDir:
    path: Path  # what the job sees as TMPDIR: the alias when there is one
    target: Path  # the real directory
    suffix_len: int
    budget: int
    alias: Alias | None = None
    alias_reason: str | None = None
    candidates: list[Candidate] = field(default_factory=list)

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_SOCKET

    @property
    def longest_final_len(self) -> int:
        return final_path_len(len(os.fsencode(str(self.path))), self.suffix_len)

    @property
    def longest_socket_path(self) -> str:
        """The longest final socket path; a library's suffix is shown as 'x' characters."""
        longest_runner = max(RUNNER_SOCKETS, key=len)
        if self.suffix_len > 1 + len(longest_runner):
            return f"{self.path}/" + "x" * (self.suffix_len - 1)
        return f"{self.path}/{longest_runner}"


def final_path_len(
    dir_len: int, suffix_len: int, socket_names: Sequence[str] = RUNNER_SOCKETS
) -> int:
    """Length in bytes of the longest socket path under a dir of `dir_len` bytes."""
    tails = [1 + len(os.fsencode(name)) for name in socket_names] + [suffix_len]
    return dir_len + max(tails)


def predicted_dir_len(root: str) -> int:
    """Length of `<root>/ap-XXXXXXXX`, the dir `mkdtemp` will create under `root`."""
    return len(os.fsencode(root.rstrip("/") or "/")) + 1 + len(DIR_PREFIX) + _RANDOM_LEN


def candidate_roots(env: Mapping[str, str], state_dir: Path) -> list[tuple[str, str]]:
    """Where a runtime dir may go, in order of preference: short, exec-capable and private first."""
    found = [
        ("AUTOPILOT_RUNTIME_ROOT", env.get("AUTOPILOT_RUNTIME_ROOT", "")),
        ("TMPDIR", env.get("TMPDIR", "")),
        ("/tmp", "/tmp"),  # noqa: S108 - a candidate root; dirs in it are made with mkdtemp
        ("/dev/shm", "/dev/shm"),  # noqa: S108 - same
        ("state dir", os.path.join(os.path.abspath(state_dir), "run")),
    ]
    seen: set[str] = set()
    roots = []
    for source, root in found:
        if not root:
            continue
        key = os.path.abspath(root)
        if key in seen:
            continue
        seen.add(key)
        roots.append((source, root))
    return roots


def is_noexec(path: str) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_NOEXEC)


def survey(
    roots: Sequence[tuple[str, str]], suffix_len: int, need_exec: bool, budget: int = SUN_PATH_MAX
) -> list[Candidate]:
    """Inspect every candidate root: usable, within the budget, exec-capable."""
    out = []
    for source, root in roots:
        final_len = final_path_len(predicted_dir_len(root), suffix_len)
        fits = final_len <= budget
        reason: str | None = None
        usable = exec_ok = False
        if not os.path.isabs(root):
            reason = f"not an absolute path: {root!r}"
        else:
            if source == "state dir":
                try:
                    os.makedirs(root, mode=0o700, exist_ok=True)
                except OSError as exc:
                    reason = f"cannot create it: {exc.strerror}"
            if reason is None and not os.path.isdir(root):
                reason = "does not exist or is not a directory"
            elif reason is None and not os.access(root, os.W_OK | os.X_OK):
                reason = "not writable by this user"
            elif reason is None:
                usable = True
                exec_ok = not is_noexec(root)
                if not fits:
                    reason = (
                        f"too long: the final socket path would be {final_len} bytes, "
                        f"over the {budget}-byte budget"
                    )
                elif need_exec and not exec_ok:
                    reason = "mounted noexec and the job needs exec"
        out.append(Candidate(source, root, final_len, usable, fits, exec_ok, reason))
    return out


def allocate_runtime(
    *,
    state_dir: Path,
    env: Mapping[str, str],
    suffix_len: int = DEFAULT_SUFFIX_LEN,
    need_exec: bool = True,
    roots: Sequence[tuple[str, str]] | None = None,
    alias_root: str | None = None,
    budget: int = SUN_PATH_MAX,
) -> RuntimeDir:
    """Create the job's runtime dir in the first candidate that fits and is usable.

    `roots` replaces the default candidates (tests); `alias_root` is where an alias goes
    when one is needed, by default the short candidate that was passed over for noexec.
    """
    if suffix_len < 0:
        raise RuntimeDirError(f"suffix length must be >= 0, not {suffix_len}")
    # Surveyed one at a time and only up to the chosen root: this is on the launch path.
    cands: list[Candidate] = []
    for root in roots if roots is not None else candidate_roots(env, state_dir):
        [cand] = survey([root], suffix_len, need_exec, budget)
        cands.append(cand)
        if cand.usable and cand.fits and (cand.exec_ok or not need_exec):
            path = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=cand.root))
            runtime = RuntimeDir(path, path, suffix_len, budget, candidates=cands)
            _check_budget(runtime)
            return runtime
    short = next((c for c in cands if c.usable and c.fits and not c.exec_ok), None)
    roomy = next((c for c in cands if c.usable and c.exec_ok), None)
    if need_exec and roomy is not None and (short is not None or alias_root is not None):
        where = alias_root if alias_root is not None else short.root  # type: ignore[union-attr]
        why = (
            f"{short.root} fits but is mounted noexec; {roomy.root} allows exec but is too long"
            if short is not None
            else f"alias root {where} given"
        )
        return _allocate_with_alias(roomy.root, where, suffix_len, budget, cands, why)
    lines = "\n".join(f"  {c.source} {c.root}: {c.reason}" for c in cands)
    raise RuntimeDirError(
        f"no runtime dir fits the {budget}-byte socket path budget "
        f"(suffix {suffix_len}, exec {'needed' if need_exec else 'not needed'}):\n{lines}\n"
        "set AUTOPILOT_RUNTIME_ROOT to a short, writable, exec-capable directory "
        "or lower the experiment's socket suffix length in autopilot.toml"
    )


def _allocate_with_alias(
    target_root: str,
    alias_root: str,
    suffix_len: int,
    budget: int,
    cands: list[Candidate],
    why: str,
) -> RuntimeDir:
    target = Path(tempfile.mkdtemp(prefix=DIR_PREFIX, dir=target_root))  # mode 0700
    try:
        alias = _make_alias(Path(alias_root), target)
        runtime = RuntimeDir(alias, target, suffix_len, budget, Alias(alias, target), why, cands)
        try:
            verify_alias(runtime.alias, suffix_len=suffix_len, budget=budget)  # type: ignore[arg-type]
        except AliasError:
            _remove_alias_if_ours(alias, target)
            raise
        return runtime
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _make_alias(alias_root: Path, target: Path) -> Path:
    # os.symlink never replaces an existing name, so a name someone else took is skipped,
    # never followed or overwritten.
    for _ in range(16):
        alias = Path(os.path.abspath(alias_root)) / f"{DIR_PREFIX}{secrets.token_hex(4)}"
        try:
            os.symlink(target, alias, target_is_directory=True)
        except FileExistsError:
            continue
        return alias
    raise RuntimeDirError(f"could not create an alias under {alias_root}: every name was taken")


def verify_alias(
    alias: Alias, *, suffix_len: int, budget: int = SUN_PATH_MAX, uid: int | None = None
) -> None:
    """Refuse an alias that is not exactly our symlink to our owner-only directory."""
    me = os.geteuid() if uid is None else uid
    try:
        link = os.lstat(alias.path)
    except FileNotFoundError:
        raise AliasError(f"alias {alias.path} does not exist") from None
    if not stat.S_ISLNK(link.st_mode):
        raise AliasError(f"alias {alias.path} is not a symlink; someone else's file is there")
    if link.st_uid != me:
        raise AliasError(f"alias {alias.path} is owned by uid {link.st_uid}, not by us ({me})")
    pointed = os.readlink(alias.path)
    if pointed != str(alias.target):
        raise AliasError(f"alias {alias.path} points at {pointed}, not at {alias.target}")
    try:
        tgt = os.lstat(alias.target)
    except FileNotFoundError:
        raise AliasError(f"alias target {alias.target} does not exist") from None
    if not stat.S_ISDIR(tgt.st_mode):
        raise AliasError(f"alias target {alias.target} is not a directory")
    if tgt.st_uid != me:
        raise AliasError(f"alias target {alias.target} is owned by uid {tgt.st_uid}, not {me}")
    if stat.S_IMODE(tgt.st_mode) != 0o700:
        raise AliasError(
            f"alias target {alias.target} has mode {stat.S_IMODE(tgt.st_mode):o}, not 700"
        )
    final_len = final_path_len(len(os.fsencode(str(alias.path))), suffix_len)
    if final_len > budget:
        raise AliasError(
            f"through the alias the final socket path is {final_len} bytes, "
            f"over the {budget}-byte budget"
        )


def _check_budget(runtime: RuntimeDir) -> None:
    if runtime.longest_final_len > runtime.budget:
        shutil.rmtree(runtime.target, ignore_errors=True)
        raise RuntimeDirError(
            f"runtime dir {runtime.path} gives {runtime.longest_final_len}-byte socket paths, "
            f"over the {runtime.budget}-byte budget"
        )


def _remove_alias_if_ours(alias: Path, target: Path) -> bool:
    try:
        link = os.lstat(alias)
    except FileNotFoundError:
        return False
    if (
        stat.S_ISLNK(link.st_mode)
        and link.st_uid == os.geteuid()
        and os.readlink(alias) == str(target)
    ):
        os.unlink(alias)
        return True
    return False


def release_runtime(runtime: RuntimeDir) -> None:
    """Remove the alias first (so nothing new reaches the target), then the target."""
    if runtime.alias is not None:
        _remove_alias_if_ours(runtime.alias.path, runtime.alias.target)
    try:
        st = os.lstat(runtime.target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(runtime.target, ignore_errors=True)


def probe_bind(runtime: RuntimeDir) -> str:
    """Bind a real Unix socket on the longest final path, proving the budget; returns it."""
    path = runtime.longest_socket_path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
    finally:
        sock.close()
        if os.path.lexists(path):
            os.unlink(path)
    return path
