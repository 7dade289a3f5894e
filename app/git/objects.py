"""A fast-forward between two repositories on one disk, without a push: the local forge takes
a cycle's results from the control host's mirror (`LocalForge.take_branch`).

A push to a repository on this host was about seven processes (`push`, `sh`, `receive-pack`,
`pack-objects`, `unpack-objects`, the connectivity check's `rev-list`, ...) and 31 ms of CPU a
cycle on the fleet bench. The objects a results commit adds (the commit, a few trees, three
blobs) are loose files in the mirror, written there a moment before; this copies exactly
the objects a push would send, `rev-list --objects <new> --not <old>`, each checked against
its name before it is written, so the receiving repository holds everything the new tip
reaches, as after a push.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import zlib
from pathlib import Path

from app.git.runner import GitRunner

#: The hash of an object id's length (a repository in SHA-256 has 64-digit ids).
_HASHES = {40: hashlib.sha1, 64: hashlib.sha256}


def copy_new(git: GitRunner, source: Path, dest: Path, new: str, old: str) -> bool:
    """Copy into `dest` the objects `new` reaches and `old` does not, from `source`'s loose
    objects. True when `dest` now holds them all; False, with nothing but spare objects left
    in `dest` (unreferenced: its upkeep drops them), when one is not a loose object of
    `source` (packed by its upkeep, or an agent's commits, which arrive as a pack)."""
    listed = git.run(["rev-list", "--objects", new, "--not", old], source)
    for line in listed.splitlines():
        oid = line.split(" ", 1)[0]
        target = dest / "objects" / oid[:2] / oid[2:]
        if target.exists():
            continue
        try:
            data = (source / "objects" / oid[:2] / oid[2:]).read_bytes()
        except FileNotFoundError:
            return False
        if not _named_by(data, oid):
            return False  # a damaged object: the push path reports it as git does
        _write(target, data)
    return True


def parents(source: Path, sha: str) -> list[str] | None:
    """The parents of commit `sha`, read from its loose object in `source` (checked against
    its name); None where it is not a loose commit there. A fast-forward onto a branch whose
    tip is a parent needs no `merge-base` process."""
    try:
        data = (source / "objects" / sha[:2] / sha[2:]).read_bytes()
    except FileNotFoundError:
        return None
    if not _named_by(data, sha):
        return None
    header, _, body = zlib.decompress(data).partition(b"\0")
    if not header.startswith(b"commit "):
        return None
    found = []
    for line in body.split(b"\n"):
        if not line.startswith(b"tree ") and not line.startswith(b"parent "):
            break  # the parents follow the tree line, before the author
        if line.startswith(b"parent "):
            found.append(line[7:].decode())
    return found


def _named_by(data: bytes, oid: str) -> bool:
    """Whether a loose object's file holds the object its name says (git's own check)."""
    digest = _HASHES.get(len(oid))
    if digest is None:
        return False
    try:
        return digest(zlib.decompress(data)).hexdigest() == oid
    except zlib.error:
        return False


def _write(target: Path, data: bytes) -> None:
    """Write the object file whole, read-only, as git does: a temporary name, then a rename
    (two writers of one object write the same bytes)."""
    target.parent.mkdir(exist_ok=True)
    temporary = target.with_name(f"tmp_obj_{os.getpid()}_{threading.get_ident()}_{target.name}")
    try:
        temporary.write_bytes(data)
        temporary.chmod(0o444)
        os.replace(temporary, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
