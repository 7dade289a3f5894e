"""The agent's scratch clone, and its work put back on the cycle's base.

An agent works in a fresh clone that shares no file with the mirror. Where the project declares
`hidden_paths` (hold-out data, the evaluator's code: docs/experiments.md, "Hidden paths"), the
clone must not hold them, in its files or in its git objects: a clone of the base would carry
them in every commit's tree. So the clone then starts at a *scratch root*: one commit with no
parent whose tree is the base's without the hidden paths. What the agent commits on it is put
back on the base with `onto_base`: its tree, plus the base's hidden entries, committed once on
the base (the agent's commits become one). A tree that adds anything under a hidden path is
refused: the agent could not see what it would overwrite.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from app.git.exceptions import AgentWorkRefused
from app.git.refs import CycleBranch
from app.git.runner import GitRunner


def _root_ref(branch: CycleBranch) -> str:
    return f"refs/autopilot/scratch/{branch.branch}"


def _under(path: str, hidden: Sequence[str]) -> bool:
    return any(path == h or path.startswith(h + "/") for h in hidden)


def _entries(git: GitRunner, mirror: Path, commit: str) -> list[tuple[str, str]]:
    """Every entry of `commit`'s tree as ("<mode> <type> <id>", path), recursively."""
    out = git.run_bytes(["ls-tree", "-r", "-z", "--full-tree", commit], mirror)
    entries = []
    for record in out.decode("utf-8", errors="surrogateescape").split("\0"):
        if record:
            meta, _, path = record.partition("\t")
            entries.append((meta, path))
    return entries


def _write_tree(git: GitRunner, mirror: Path, entries: list[tuple[str, str]]) -> str:
    """The tree of exactly `entries`, built in an index of its own (the mirror's is untouched)."""
    lines = "".join(f"{meta}\t{path}\0" for meta, path in entries)
    with tempfile.TemporaryDirectory(prefix="scratch-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git.run_bytes(
            ["update-index", "-z", "--index-info"],
            mirror,
            extra_env=env,
            stdin=lines.encode("utf-8", errors="surrogateescape"),
        )
        return git.run(["write-tree"], mirror, extra_env=env)


def clone(git: GitRunner, branch: CycleBranch, dest: Path, hidden: Sequence[str] = ()) -> str:
    """A fresh clone of the branch in `dest` for the agent, sharing no file with the mirror
    (`--no-local`: the agent may write anything in it, nothing of it comes back but a bundle)
    and naming no remote; with `hidden`, of the scratch root instead. The commit it starts at
    (the one the agent's bundle is cut from)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not hidden:
        clone_args = ["clone", "--quiet", "--no-local", "--no-hardlinks", "--single-branch"]
        git.run(
            [
                *clone_args,
                "--branch",
                branch.branch,
                "--end-of-options",
                str(branch.mirror),
                str(dest),
            ],
            dest.parent,
        )
        git.run(["remote", "remove", "origin"], dest)
        return git.run(["rev-parse", "HEAD"], dest)
    kept = [e for e in _entries(git, branch.mirror, branch.base_sha) if not _under(e[1], hidden)]
    tree = _write_tree(git, branch.mirror, kept)
    message = f"The base {branch.base_sha[:12]} without the project's hidden paths"
    root = git.run(["commit-tree", tree, "-m", message], branch.mirror, identity=True)
    git.run(["update-ref", _root_ref(branch), root], branch.mirror)
    git.run(["init", "--quiet", "--initial-branch", branch.branch, str(dest)], dest.parent)
    git.run(["fetch", "--quiet", "--no-tags", str(branch.mirror), _root_ref(branch)], dest)
    git.run(["reset", "--quiet", "--hard", "FETCH_HEAD"], dest)
    return root


def onto_base(git: GitRunner, branch: CycleBranch, head: str, hidden: Sequence[str]) -> str:
    """The agent's `head` (cut from the scratch root) as one commit on the branch's base: its
    tree with the base's hidden entries back. Refused: a head that does not descend from the
    scratch root, or a tree with anything under a hidden path."""
    mirror = branch.mirror
    root = git.run(["rev-parse", "--verify", f"{_root_ref(branch)}^{{commit}}"], mirror)
    if not git.ok(["merge-base", "--is-ancestor", root, head], mirror):
        raise AgentWorkRefused(
            f"the agent's head {head[:12]} does not descend from the commit its clone started "
            "at; it may add commits, not rewrite history"
        )
    theirs = _entries(git, mirror, head)
    planted = [path for _, path in theirs if _under(path, hidden)]
    if planted:
        raise AgentWorkRefused(
            "the agent's change adds files under hidden paths (hold-out data, the evaluator): "
            + ", ".join(planted[:10]),
            paths=planted,
        )
    if git.run(["rev-parse", f"{head}^{{tree}}"], mirror) == git.run(
        ["rev-parse", f"{root}^{{tree}}"], mirror
    ):
        return branch.base_sha  # nothing changed
    restored = [e for e in _entries(git, mirror, branch.base_sha) if _under(e[1], hidden)]
    tree = _write_tree(git, mirror, theirs + restored)
    message = git.run(["log", "-1", "--format=%B", head], mirror) or "Change proposed by the agent"
    return git.run(
        ["commit-tree", tree, "-p", branch.base_sha, "-m", message], mirror, identity=True
    )
