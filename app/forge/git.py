"""Git work for a cycle: a mirror per project, a worktree and branch per cycle, commits, pushes.

Every git call goes through `gitrunner.GitRunner` (a fixed, safe environment; credentials
stripped from every error). A remote URL is passed per call and never written into a
repository's config, so no token rests on disk.
"""

from __future__ import annotations

import logging
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from app.forge import protected
from app.forge.exceptions import (
    BaseBranchMissing,
    GitFailed,
    InvalidRef,
    PushFailed,
    PushRejected,
)
from app.forge.gitrunner import (
    GitRunner,
    check_branch_name,
    check_url,
    fetch_failure,
    repo_lock,
)
from app.projects import schemas as ops_schemas
from app.settings import Settings, redact_text

log = logging.getLogger(__name__)

REMOTE_PREFIX = "refs/remotes/origin/"
BRANCH_PREFIX = "autopilot"
_SHORT_ID = re.compile(r"^[A-Za-z0-9]{1,40}$")
_SLUG_CHARS = re.compile(r"[^a-z0-9]+")
# What a push error says when the remote refused it on purpose: retrying cannot help.
_REJECTED = (
    "[remote rejected]",
    "[rejected]",
    "pre-receive hook declined",
    "non-fast-forward",
    "protected branch",
    "permission denied",
    "denied to",
    "authentication failed",
    "could not read username",
    "repository not found",
    "does not appear to be a git repository",
)


def slugify(text: str, limit: int = 40) -> str:
    """A branch-safe slug of free text (a hypothesis title): lower case, digits and '-'."""
    slug = _SLUG_CHARS.sub("-", text.lower()).strip("-")[:limit].strip("-")
    return slug or "change"


def short_id(cycle_id: str | int) -> str:
    value = str(cycle_id).replace("-", "")
    if str(cycle_id).startswith("-") or not _SHORT_ID.fullmatch(value):
        raise InvalidRef(f"cycle id {cycle_id!r} must be letters and digits")
    return value[:8].lower()


def branch_name(project: str, cycle_id: str | int, slug: str) -> str:
    """`autopilot/<project>/<cycle-short-id>-<slug>`, validated."""
    try:
        ops_schemas.check_slug(project, "project")
    except ValueError as exc:
        raise InvalidRef(str(exc)) from None
    return check_branch_name(f"{BRANCH_PREFIX}/{project}/{short_id(cycle_id)}-{slugify(slug)}")


@dataclass(frozen=True)
class Worktree:
    """A cycle's checkout: its branch, the base it started from, and the project's mirror."""

    project: str
    path: Path
    branch: str
    base: str
    base_sha: str
    mirror: Path


class GitWork:
    """Mirrors under `<state>/repos/`, worktrees under `<state>/worktrees/`, pushes with retries."""

    def __init__(
        self,
        settings: Settings,
        *,
        token: SecretStr | None = None,
        push_attempts: int = 4,
        push_backoff_s: float = 1.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        state = settings.state_dir.absolute()
        self.repos_dir = state / "repos"
        self.worktrees_dir = state / "worktrees"
        if token is None and settings.forge == "github":
            token = settings.github_token
        self.git = GitRunner(
            token=token, author=(settings.git_author_name, settings.git_author_email)
        )
        self._push_attempts = max(1, push_attempts)
        self._push_backoff_s = push_backoff_s
        self._sleep = sleep

    # -- the mirror -----------------------------------------------------------------------

    def mirror_path(self, project: str) -> Path:
        try:
            ops_schemas.check_slug(project, "project")
        except ValueError as exc:
            raise InvalidRef(str(exc)) from None
        return self.repos_dir / f"{project}.git"

    def fetch(self, project: str, url: str) -> Path:
        """Create the project's mirror if needed and bring its remote branches up to date."""
        check_url(url)
        mirror = self.mirror_path(project)
        with repo_lock(mirror):
            if not (mirror / "HEAD").exists():
                mirror.mkdir(parents=True, exist_ok=True)
                self.git.run(["init", "--bare", "--quiet", str(mirror)], mirror.parent)
            # Bytecode the guard or the experiment writes in a worktree never joins a commit.
            exclude = mirror / "info" / "exclude"
            exclude.parent.mkdir(parents=True, exist_ok=True)
            if "__pycache__/" not in (exclude.read_text() if exclude.exists() else ""):
                with open(exclude, "a", encoding="utf-8") as handle:
                    handle.write("\n__pycache__/\n*.pyc\n")
            try:
                self.git.run(
                    [
                        "fetch",
                        "--quiet",
                        "--prune",
                        "--no-tags",
                        "--end-of-options",
                        url,
                        f"+refs/heads/*:{REMOTE_PREFIX}*",
                    ],
                    mirror,
                    url=url,
                )
            except GitFailed as exc:
                raise fetch_failure(exc, url) from None
        return mirror

    def read_at(self, project: str, url: str, branch: str, path: str) -> tuple[str, str | None]:
        """Fetch the project's mirror from `url`, then read `path` at the tip of `branch`:
        (the commit, the file's text or None where that commit has no such file)."""
        check_branch_name(branch)
        mirror = self.fetch(project, url)
        try:
            sha = self.git.run(
                ["rev-parse", "--verify", "--quiet", f"{REMOTE_PREFIX}{branch}^{{commit}}"], mirror
            )
        except GitFailed:
            raise BaseBranchMissing(
                f"branch {branch!r} does not exist on the project's repository "
                f"{redact_text(url)[:200]}; check the project's default_branch"
            ) from None
        try:
            text = self.git.run(["cat-file", "blob", f"{sha}:{path}"], mirror)
        except GitFailed:
            return sha, None
        return sha, text

    def remote_head(self, url: str, branch: str) -> str | None:
        """The commit a branch points at on the remote now, or None if it does not exist."""
        check_url(url)
        check_branch_name(branch)
        self.repos_dir.mkdir(parents=True, exist_ok=True)
        out = self.git.run(
            ["ls-remote", "--end-of-options", url, f"refs/heads/{branch}"], self.repos_dir, url=url
        )
        for line in out.splitlines():
            sha, _, ref = line.partition("\t")
            if ref == f"refs/heads/{branch}":
                return sha
        return None

    # -- worktrees ------------------------------------------------------------------------

    def prepare_worktree(
        self, project: str, url: str, base: str, cycle_id: str | int, slug: str
    ) -> Worktree:
        """The cycle's worktree on its own branch from the remote's `base`; reused if present.

        Called again after a crash, it returns the same worktree with the base it started from
        (the merge base with the remote's base), so a base that moved since is not picked up.
        """
        check_branch_name(base)
        branch = branch_name(project, cycle_id, slug)
        mirror = self.fetch(project, url)
        remote_base = f"{REMOTE_PREFIX}{base}"
        try:
            base_tip = self.git.run(
                ["rev-parse", "--verify", "--quiet", f"{remote_base}^{{commit}}"], mirror
            )
        except GitFailed:
            raise BaseBranchMissing(
                f"branch {base!r} does not exist on the project's remote; "
                "check the project's default_branch"
            ) from None
        path = self.worktrees_dir / project / short_id(cycle_id)
        with repo_lock(mirror):
            has_branch = self.git.ok(
                ["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], mirror
            )
            if has_branch and (path / ".git").exists():
                head = self.git.run(["symbolic-ref", "--quiet", "HEAD"], path)
                if head != f"refs/heads/{branch}":
                    raise GitFailed(f"worktree {path} is on {head}, expected {branch}")
            else:
                if path.exists():
                    shutil.rmtree(path)
                self.git.run(["worktree", "prune"], mirror)
                path.parent.mkdir(parents=True, exist_ok=True)
                if has_branch:
                    self.git.run(
                        ["worktree", "add", "--quiet", "--end-of-options", str(path), branch],
                        mirror,
                    )
                else:
                    self.git.run(
                        [
                            "worktree",
                            "add",
                            "--quiet",
                            "-b",
                            branch,
                            "--end-of-options",
                            str(path),
                            base_tip,
                        ],
                        mirror,
                    )
            base_sha = self.git.run(["merge-base", "HEAD", base_tip], path)
        return Worktree(project, path, branch, base, base_sha, mirror)

    def merged_checkout(self, project: str, url: str, head: str, base_sha: str, dest: Path) -> Path:
        """A detached checkout of `head` merged onto `base_sha`: what a merge would produce,
        for re-validating a result on a base that moved. Raises GitFailed on a conflict."""
        check_branch_name(head)
        if not all(c in "0123456789abcdef" for c in base_sha) or len(base_sha) < 7:
            raise InvalidRef(f"{base_sha!r} is not a commit sha")
        mirror = self.fetch(project, url)
        with repo_lock(mirror):
            if dest.exists():
                shutil.rmtree(dest)
            self.git.run(["worktree", "prune"], mirror)
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.git.run(
                ["worktree", "add", "--quiet", "--detach", "--end-of-options", str(dest), base_sha],
                mirror,
            )
            self.git.run(
                [
                    "merge",
                    "--quiet",
                    "--no-ff",
                    "--no-edit",
                    "--end-of-options",
                    f"{REMOTE_PREFIX}{head}",
                ],
                dest,
                identity=True,
            )
        return dest

    def push_checkout(self, checkout: Path, url: str, branch: str) -> str:
        """Push a detached checkout's HEAD (a re-validation merge) to `branch` of the forge, so
        GPU hosts can fetch it; the branch is the autopilot's own and is overwritten."""
        check_url(url)
        check_branch_name(branch)
        sha = self.git.run(["rev-parse", "HEAD"], checkout)
        try:
            self.git.run(
                ["push", "--force", "--end-of-options", url, f"HEAD:refs/heads/{branch}"],
                checkout,
                url=url,
            )
        except GitFailed as exc:
            raise PushFailed(f"pushing {branch} failed: {exc.detail}", branch=branch) from None
        return sha

    def remove_worktree(self, worktree: Worktree) -> None:
        """Drop the checkout (after the push); the branch stays in the mirror and the remote."""
        with repo_lock(worktree.mirror):
            if worktree.path.exists():
                self.git.run(
                    ["worktree", "remove", "--force", "--end-of-options", str(worktree.path)],
                    worktree.mirror,
                )
            self.git.run(["worktree", "prune"], worktree.mirror)

    # -- protected paths, commit, push ------------------------------------------------------

    def check_protected(
        self, worktree: Worktree, *, ref: str | None = None, allowed: Sequence[str] = ()
    ) -> protected.Check:
        """Raise `ProtectedPathChanged` if the index (or `ref`) differs from the base in any
        protected path; return the hashes checked otherwise."""
        result = protected.check(
            lambda args: self.git.run(args, worktree.path),
            worktree.base_sha,
            ref=ref,
            allowed=allowed,
        )
        result.raise_for_violations()
        return result

    def commit(self, worktree: Worktree, message: str, *, allowed: Sequence[str] = ()) -> str:
        """Stage everything, refuse protected-path changes, commit as the autopilot; the sha.

        `allowed` names paths the autopilot itself writes (this cycle's `results/<cycle>/`).
        Idempotent: with nothing new to commit it returns the current head.
        """
        self.git.run(["add", "--all"], worktree.path)
        self.check_protected(worktree, allowed=allowed)
        staged = self.git.run(["diff", "--cached", "--name-only", "-z"], worktree.path)
        if staged:
            self.git.run(
                ["commit", "--quiet", "--no-verify", "--no-gpg-sign", "-m", message],
                worktree.path,
                identity=True,
            )
        return self.git.run(["rev-parse", "HEAD"], worktree.path)

    def push(self, worktree: Worktree, url: str, *, allowed: Sequence[str] = ()) -> str:
        """Push the cycle's branch; retries transient failures with backoff. Returns the sha.

        The pushed commit is checked against the protected paths once more, so a commit the
        agent made itself cannot slip a changed judge past `commit`.
        """
        check_url(url)
        sha = self.git.run(["rev-parse", "HEAD"], worktree.path)
        self.check_protected(worktree, ref=sha, allowed=allowed)
        refspec = f"refs/heads/{worktree.branch}:refs/heads/{worktree.branch}"
        delay = self._push_backoff_s
        for attempt in range(1, self._push_attempts + 1):
            try:
                self.git.run(
                    ["push", "--end-of-options", url, refspec],
                    worktree.mirror,
                    url=url,
                )
                return sha
            except GitFailed as exc:
                lowered = exc.detail.lower()
                if any(marker in lowered for marker in _REJECTED):
                    raise PushRejected(
                        f"the remote rejected branch {worktree.branch}: {exc.detail}",
                        branch=worktree.branch,
                    ) from None
                if attempt == self._push_attempts:
                    raise PushFailed(
                        f"pushing {worktree.branch} failed {attempt} times; last error: "
                        f"{exc.detail}",
                        branch=worktree.branch,
                    ) from None
                log.warning(
                    "push of %s failed (attempt %d), retrying in %.1f s: %s",
                    worktree.branch,
                    attempt,
                    delay,
                    exc.detail,
                )
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover
