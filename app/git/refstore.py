"""A branch's tip read from the repository's files, without a git process.

A cycle's steps read a few refs each (their branch, the base, the forge's copy): one
`for-each-ref` each, about 3 ms of CPU for git to start, against a file read here. Only the
case git's own layout answers without doubt is read: the `files` ref backend (a loose ref
file, else the `packed-refs` line), a ref holding an object id, and an id this process already
knows to name a commit (`remember`: an id names the same object everywhere and for good). Any
other case (a symbolic ref, reftable, a linked worktree, an id not known yet) answers None, and
the caller asks git, which also tells an annotated tag under a branch's name from a commit.

The order is git's: the loose file first, then `packed-refs`. `git pack-refs` writes the new
`packed-refs` before it deletes a loose file, so a ref that exists throughout is found in one or
the other; `packed-refs` is parsed again whenever its stat changes.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

_HEX = frozenset("0123456789abcdef")
_KNOWN_MAX = 4096

_lock = threading.Lock()
#: Object ids known to name commits, most recent last (bounded: a long-lived worker).
_commits: OrderedDict[str, None] = OrderedDict()
#: Parsed `packed-refs` by path: (its stat, ref -> id).
_packed: dict[Path, tuple[tuple[int, int, int], dict[str, str]]] = {}


def remember(*shas: str) -> None:
    """Note ids git has shown to name commits (a `commit-tree`'s output, a tip git read)."""
    with _lock:
        for sha in shas:
            if _is_id(sha):
                _commits[sha] = None
                _commits.move_to_end(sha)
        while len(_commits) > _KNOWN_MAX:
            _commits.popitem(last=False)


def tips(cwd: Path, refs: tuple[str, ...]) -> dict[str, str] | None:
    """The commits the full refs point at (a missing ref left out), or None where the files
    cannot answer for certain and git must be asked."""
    git_dir = _git_dir(Path(cwd))
    if git_dir is None:
        return None
    found: dict[str, str] = {}
    for ref in refs:
        if not ref.startswith("refs/") or ".." in ref or ref.endswith("/"):
            return None
        sha = _loose(git_dir / ref)
        if sha == "":
            return None  # a symbolic ref or a file git would reject: git says what it means
        if sha is None:
            sha = _packed_refs(git_dir).get(ref)
            if sha is None:
                continue
        with _lock:
            if sha not in _commits:
                return None
        found[ref] = sha
    return found


def _git_dir(cwd: Path) -> Path | None:
    """The repository's own directory where it is a plain one of the files backend."""
    for candidate in (cwd, cwd / ".git"):
        if (candidate / "HEAD").is_file() and (candidate / "refs").is_dir():
            # A linked worktree shares refs through `commondir`; reftable keeps none as files.
            if (candidate / "commondir").exists() or (candidate / "reftable").exists():
                return None
            return candidate
    return None


def _loose(path: Path) -> str | None:
    """The id in a loose ref file; None where there is none; "" where it holds anything else."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    except (OSError, UnicodeDecodeError):
        return ""
    return text if _is_id(text) else ""


def _packed_refs(git_dir: Path) -> dict[str, str]:
    path = git_dir / "packed-refs"
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return {}
    key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _lock:
        kept = _packed.get(path)
    if kept is not None and kept[0] == key:
        return kept[1]
    refs: dict[str, str] = {}
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return {}
    for line in lines:
        if line.startswith(("#", "^")):  # the header; a peeled tag's target
            continue
        sha, _, name = line.partition(" ")
        if _is_id(sha) and name:
            refs[name] = sha
    with _lock:
        _packed[path] = (key, refs)
    return refs


def _is_id(text: str) -> bool:
    return len(text) in (40, 64) and set(text) <= _HEX
