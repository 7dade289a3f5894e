"""Protected paths: the agent may not change the judge (the harness, the evaluation, the data).

The list comes from `autopilot.toml` *at the base commit* (`[protected] paths = [...]`, and
`[project] protected_paths` and `hidden_paths`), so an
agent cannot unprotect a path by editing the config in the same change. `autopilot.toml` itself
and earlier cycles' `results/` are always protected. The check compares git's object hashes of
every protected path (mode and object, so a file turned into a symlink counts) in the candidate
commit with those at the base. `forbidden_entries` lists what an agent's commit may never add,
wherever it is: git internals, bytecode, submodules and symlinks that leave the repository.
"""

from __future__ import annotations

import fnmatch
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from app.git.exceptions import GitFailed, ProtectedPathChanged

CONFIG_NAME = "autopilot.toml"
ALWAYS_PROTECTED = (CONFIG_NAME, "results/")

RunGit = Callable[[Sequence[str]], str]


def _normalise(pattern: str) -> str:
    return pattern.strip().removeprefix("./").lstrip("/")


def patterns_from_config(text: str | None) -> list[str]:
    """The protected patterns declared in autopilot.toml text, plus the ones always protected."""
    declared: list[str] = []
    if text:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ProtectedPathChanged(
                f"{CONFIG_NAME} at the base commit is not valid TOML ({exc}); fix it on the base "
                "branch before running cycles"
            ) from None
        # The project config declares `[project] protected_paths` (app.cycles.config); a
        # `[protected] paths` table is read too.
        section = data.get("project", {})
        table = data.get("protected", {})
        raw = table.get("paths", []) if isinstance(table, dict) else table
        if isinstance(section, dict) and isinstance(raw, list):
            # Hidden paths (hold-out data, the evaluator) are the judge too: no candidate
            # changes them (docs/design.md, "Where a number comes from").
            raw = [*raw, *section.get("protected_paths", []), *section.get("hidden_paths", [])]
        if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
            raise ProtectedPathChanged(
                f"{CONFIG_NAME}: [protected] paths must be a list of path strings or globs"
            )
        declared = [_normalise(p) for p in raw if _normalise(p)]
    return [*ALWAYS_PROTECTED, *declared]


def matches(path: str, pattern: str) -> bool:
    """A path is protected by `dir/` or `dir` (everything below), an exact path, or a glob."""
    bare = pattern.rstrip("/")
    if path == bare or path.startswith(bare + "/"):
        return True
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern + "/*")


def is_protected(path: str, patterns: Sequence[str], allowed: Sequence[str] = ()) -> bool:
    if any(matches(path, a) for a in allowed):
        return False
    return any(matches(path, p) for p in patterns)


@dataclass
class Check:
    """What was compared: each protected path's object hash at the base and in the candidate."""

    patterns: list[str]
    base_hashes: dict[str, str] = field(default_factory=dict)
    candidate_hashes: dict[str, str] = field(default_factory=dict)

    @property
    def violations(self) -> list[str]:
        paths = set(self.base_hashes) | set(self.candidate_hashes)
        return sorted(p for p in paths if self.base_hashes.get(p) != self.candidate_hashes.get(p))

    def raise_for_violations(self) -> None:
        changed = self.violations
        if changed:
            shown = ", ".join(changed[:20]) + (
                f" and {len(changed) - 20} more" if len(changed) > 20 else ""
            )
            raise ProtectedPathChanged(
                f"the change touches protected path(s): {shown}; the agent may not change the "
                f"harness, the evaluation or reference data (see [protected] in {CONFIG_NAME})",
                paths=changed,
            )


def _tree_hashes(run: RunGit, ref: str) -> dict[str, str]:
    out = run(["ls-tree", "-r", "-z", "--full-tree", ref])
    hashes: dict[str, str] = {}
    for entry in out.split("\0"):
        if not entry:
            continue
        meta, _, path = entry.partition("\t")
        mode, _kind, sha = meta.split(" ")
        hashes[path] = f"{mode}:{sha}"
    return hashes


def check(run: RunGit, base_sha: str, *, ref: str, allowed: Sequence[str] = ()) -> Check:
    """Compare the protected paths of commit `ref` with the base commit."""
    try:
        config = run(["show", f"{base_sha}:{CONFIG_NAME}"])
    except GitFailed:  # no autopilot.toml at the base: only the built-in list applies
        config = None
    patterns = patterns_from_config(config)
    allowed = [_normalise(a) for a in allowed]
    base = _tree_hashes(run, base_sha)
    candidate = _tree_hashes(run, ref)
    result = Check(patterns)
    result.base_hashes = {p: h for p, h in base.items() if is_protected(p, patterns, allowed)}
    result.candidate_hashes = {
        p: h for p, h in candidate.items() if is_protected(p, patterns, allowed)
    }
    # A new package dir `x/` or extension `x*.so` beside a protected module `x.py` is what
    # `import x` finds first: it would replace the judge without touching it.
    modules = [p.removesuffix(".py") for p in result.base_hashes if p.endswith(".py")]
    for path, digest in candidate.items():
        if path not in base and any(
            path.startswith(m + "/") or (path.startswith(m + ".") and path.endswith(".so"))
            for m in modules
        ):
            result.candidate_hashes[path] = digest
    return result


_SYMLINK, _SUBMODULE = "120000", "160000"


def change_id(run: RunGit, base_sha: str, head: str) -> str | None:
    """What `head` changes from `base_sha`, as content: "<base tree>..<head tree>", or None
    when the trees are the same. Commit messages, authors, dates and how the change was split
    into commits do not enter it: the same edit made twice is the same change, and the same
    edit on another base is another (the fingerprint of a hypothesis includes it)."""
    base_tree, head_tree = (
        run(["rev-parse", "--verify", f"{sha}^{{tree}}"]) for sha in (base_sha, head)
    )
    return None if base_tree == head_tree else f"{base_tree}..{head_tree}"


def _forbidden_name(path: str) -> str | None:
    for part in path.split("/"):
        lowered = part.lower()
        # `.git` in any case or with trailing dots/spaces: what checkouts on other systems read
        # as the repository's own git dir.
        if lowered.rstrip(". ") == ".git" or lowered.startswith(".git~"):
            return f"{path}: a .git entry"
        if part == "__pycache__":
            return f"{path}: a __pycache__ directory (bytecode is never committed)"
    if path.endswith((".pyc", ".pyo")):
        return f"{path}: a bytecode file (bytecode is never committed)"
    return None


def forbidden_entries(run: RunGit, base_sha: str, head: str) -> list[str]:
    """What the commits from `base_sha` to `head` add or change that an agent may never commit:
    a `.git` file or directory, a `__pycache__` dir, a `*.pyc` file, a submodule, or a symlink
    whose target is absolute or climbs with `..`. One line per entry."""
    out = run(["diff-tree", "-r", "-z", "--no-renames", "--no-commit-id", base_sha, head])
    fields = out.split("\0")
    problems: list[str] = []
    for meta, path in zip(fields[0::2], fields[1::2], strict=False):
        if not meta.startswith(":"):
            continue
        _old_mode, new_mode, _old_sha, new_sha, status = meta[1:].split(" ")
        if status == "D":
            continue
        if reason := _forbidden_name(path):
            problems.append(reason)
        elif new_mode == _SUBMODULE:
            problems.append(f"{path}: a submodule")
        elif new_mode == _SYMLINK:
            # Only links that go down stay inside whatever other links they pass through: a
            # `..` is checked by nothing but the path's text, and a chain of links can climb
            # out of the tree with it.
            target = run(["cat-file", "blob", new_sha])
            if target.startswith("/") or ".." in target.split("/"):
                problems.append(
                    f"{path}: a symlink to {target!r}; an agent's links may only point down "
                    "into the repository (no absolute target, no '..')"
                )
    return problems
