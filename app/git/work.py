"""Git work for a cycle: a mirror per project, a branch per cycle, commits from objects, pushes.

The control host never works in a tree that untrusted code could write (docs/design.md, "Hosts and
boundaries"): a cycle's branch lives in the project's mirror; the agent's work comes back as a
git bundle fetched into it and checked on the commit trees; the results are committed through
a private index, never by staging a directory. Every git call goes through
`gitrunner.GitRunner` (hooks and fsmonitor off, a minimal environment, credentials stripped
from every error). A remote URL is passed per call and never written into a repository's
config, so no token rests on disk.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import SecretStr

from app.git import protected, refstore, scratch
from app.git.exceptions import (
    AgentWorkRefused,
    BaseBranchMissing,
    FetchFailed,
    GitFailed,
    InvalidRef,
    MergeConflict,
    PushFailed,
    PushRejected,
)
from app.git.refs import REMOTE_PREFIX, CycleBranch, branch_name, check_sha
from app.git.runner import (
    GitRunner,
    check_branch_name,
    check_url,
    fetch_failure,
    github_git_prefix,
    local_path,
    repo_lock,
    single_flight,
)
from app.projects import schemas as ops_schemas
from app.redaction import redact_text
from app.settings import Settings

log = logging.getLogger(__name__)

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


class GitWork:
    """Mirrors under `<state>/repos/`; cycle branches in them; pushes with retries."""

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
        self._tmp = state / "tmp"
        if token is None and settings.forge == "github":
            token = settings.github_token
        self.git = GitRunner(
            token=token,
            token_prefix=github_git_prefix(settings.github_base_url),
            author=(settings.git_author_name, settings.git_author_email),
        )
        self._push_attempts = max(1, push_attempts)
        self._push_backoff_s = push_backoff_s
        self._sleep = sleep
        self._tips: dict[tuple[Path, str], str] = {}

    # -- the mirror -----------------------------------------------------------------------

    def mirror_path(self, project: str) -> Path:
        try:
            ops_schemas.check_slug(project, "project")
        except ValueError as exc:
            raise InvalidRef(str(exc)) from None
        return self.repos_dir / f"{project}.git"

    def fetch(self, project: str, url: str, branch: str | None = None) -> Path:
        """Create the project's mirror if needed and bring its remote branches (or `branch`
        alone: a forge holds a branch per cycle) up to date; a named branch missing from the
        remote raises BaseBranchMissing. Concurrent calls for one mirror share a fetch of the
        same branches that began after they asked (`single_flight`)."""
        check_url(url)
        mirror = self.mirror_path(project)
        refspec = (
            f"+refs/heads/*:{REMOTE_PREFIX}*"
            if branch is None
            else f"+refs/heads/{check_branch_name(branch)}:{REMOTE_PREFIX}{branch}"
        )
        if branch is not None and self._unmoved(mirror, url, branch):
            return mirror
        with single_flight(mirror, f"{url} {refspec}") as needed:
            if not needed:  # a fetch that began after this call asked has just finished
                return mirror
            if not (mirror / "HEAD").exists():
                mirror.mkdir(parents=True, exist_ok=True)
                self.git.run(["init", "--bare", "--quiet", str(mirror)], mirror.parent)
            try:
                self.git.run(
                    [
                        "fetch",
                        "--quiet",
                        "--prune",
                        "--no-tags",
                        "--end-of-options",
                        url,
                        refspec,
                    ],
                    mirror,
                    url=url,
                )
            except GitFailed as exc:
                raise fetch_failure(exc, url, branch) from None
        return mirror

    def _unmoved(self, mirror: Path, url: str, branch: str) -> bool:
        """Whether `branch` of a repository on this host (the local forge) is where this mirror's
        last fetch left it: two ref reads, where a fetch bringing nothing was five processes."""
        source = local_path(url)
        if source is None or not (mirror / "HEAD").exists():
            return False
        ref, tracking = f"refs/heads/{branch}", f"{REMOTE_PREFIX}{branch}"
        try:
            there = self.git.ref_tips(source, ref).get(ref)
            return there is not None and self.git.ref_tips(mirror, tracking).get(tracking) == there
        except GitFailed:
            return False  # not a repository (yet): the fetch says what is wrong

    def read_at(self, project: str, url: str, branch: str, path: str) -> tuple[str, str | None]:
        """Fetch the project's mirror from `url`, then read `path` at the tip of `branch`: the
        commit, and the file's text (None where that commit has none)."""
        check_branch_name(branch)
        missing = BaseBranchMissing(
            f"branch {branch!r} does not exist on the project's repository "
            f"{redact_text(url)[:200]}; check the project's default_branch"
        )
        try:
            mirror = self.fetch(project, url, branch)
            tip = f"{REMOTE_PREFIX}{branch}^{{commit}}"
            sha = self.git.run(["rev-parse", "--verify", "--quiet", tip], mirror)
        except FetchFailed:
            raise
        except (GitFailed, BaseBranchMissing):
            raise missing from None
        return sha, self.show(project, sha, path)

    def show(self, project: str, commit: str, path: str) -> str | None:
        """The text of `path` at `commit` in the project's mirror, or None where it has none."""
        check_sha(commit)
        try:
            return self.git.run(["cat-file", "blob", f"{commit}:{path}"], self.mirror_path(project))
        except GitFailed:
            return None

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

    # -- the cycle's branch ---------------------------------------------------------------

    def start_branch(
        self,
        project: str,
        url: str,
        base: str,
        cycle_id: str | int,
        slug: str,
        *,
        base_sha: str | None = None,
    ) -> CycleBranch:
        """The cycle's branch in the mirror, made at the remote's `base`; reused if present.

        Called again after a crash, it returns the same branch with the base it started from
        (the merge base with the remote's base), so a base that moved since is not picked up.
        A caller that knows that base (`base_sha`, recorded on the cycle by its plan) gets the
        branch without a fetch when the mirror holds that commit: made there if it is not yet,
        so the steps after the plan's fetch touch no remote to start it.
        """
        check_branch_name(base)
        branch = branch_name(project, cycle_id, slug)
        ref, remote_base = f"refs/heads/{branch}", f"{REMOTE_PREFIX}{base}"
        if base_sha is not None:
            mirror = self.mirror_path(project)
            if (mirror / "HEAD").exists():
                known = CycleBranch(project, branch, base, check_sha(base_sha), mirror)
                if tip := self.git.ref_tips(mirror, ref).get(ref):
                    return self._at(known, tip)
                try:  # made at the recorded base where the mirror holds it (`""`: if absent)
                    with repo_lock(mirror):
                        self.git.run(["update-ref", ref, base_sha, ""], mirror)
                    return self._at(known, base_sha)
                except GitFailed:
                    pass  # not fetched here yet, or made meanwhile: as below
        mirror = self.fetch(project, url)
        with repo_lock(mirror):
            tips = self.git.ref_tips(mirror, remote_base, ref)
            base_tip = tips.get(remote_base)
            if base_tip is None:
                raise BaseBranchMissing(
                    f"branch {base!r} does not exist on the project's remote; "
                    "check the project's default_branch"
                )
            tip = tips.get(ref)
            if tip is None:
                # At the base the cycle recorded where the fetch brought it (a mirror made
                # afresh), else at the remote's base now (that base is gone from the remote).
                start = base_tip
                if base_sha is not None and self.git.ok(["cat-file", "-e", base_sha], mirror):
                    start = base_sha
                self.git.run(["update-ref", ref, start, ""], mirror)
                # Made at `start` just now: that is its merge base with the base.
                return self._at(CycleBranch(project, branch, base, start, mirror), start)
            base_sha = self.git.run(["merge-base", ref, base_tip], mirror)
        return self._at(CycleBranch(project, branch, base, base_sha, mirror), tip)

    def _at(self, branch: CycleBranch, tip: str) -> CycleBranch:
        """Remember `branch`'s tip as this GitWork last read or wrote it: a step's later
        `tip()` needs no git. (A cycle's branch moves only through its one advancer, and a step
        uses one GitWork, so what it wrote last is what the branch holds.)"""
        self._tips[(branch.mirror, branch.ref)] = tip
        refstore.remember(tip)  # a branch holds a commit: git refuses anything else there
        return branch

    def tip(self, branch: CycleBranch) -> str:
        if (known := self._tips.get((branch.mirror, branch.ref))) is not None:
            return known
        return self.git.run(["rev-parse", "--verify", f"{branch.ref}^{{commit}}"], branch.mirror)

    def change_id(self, branch: CycleBranch, head: str) -> str | None:
        """What `head` changes from the base, as content (`protected.change_id`)."""
        return protected.change_id(lambda a: self.git.run(a, branch.mirror), branch.base_sha, head)

    def move_branch(self, branch: CycleBranch, sha: str, *, after: str | None = None) -> None:
        """Point the branch at `sha`, a commit of the mirror that descends from `after` (the
        branch's base by default): a campaign's confirmation runs a step's candidate, and its
        line fast-forwards to a kept one. Anything else is refused (InvalidRef)."""
        check_sha(sha)
        since = after or branch.base_sha
        if not self.git.ok(["merge-base", "--is-ancestor", since, sha], branch.mirror):
            raise InvalidRef(
                f"commit {sha[:12]} does not descend from {since[:12]}: branch "
                f"{branch.branch} only moves forward"
            )
        with repo_lock(branch.mirror):
            self.git.run(["update-ref", branch.ref, sha], branch.mirror)
        self._at(branch, sha)

    def reset_to_base(self, branch: CycleBranch) -> None:
        """Drop whatever an earlier (crashed) agent run left on the branch."""
        with repo_lock(branch.mirror):
            self.git.run(["update-ref", branch.ref, branch.base_sha], branch.mirror)
        self._at(branch, branch.base_sha)

    def scratch_clone(self, branch: CycleBranch, dest: Path, hidden: Sequence[str] = ()) -> str:
        """The agent's fresh clone of the branch, without `hidden` paths (`scratch.clone`);
        the commit it starts at."""
        return scratch.clone(self.git, branch, dest, hidden)

    def take_agent_work(
        self, branch: CycleBranch, bundle: Path | None, hidden: Sequence[str] = ()
    ) -> str:
        """Fetch the agent's commits from its bundle (objects only, each one checked by git's
        fsck), check them on the trees, and move the branch to them; the branch's tip.

        Refused (AgentWorkRefused, the branch unchanged): a head that does not descend from
        the base, a `.git`, `__pycache__` or `*.pyc` entry, a submodule, a symlink leaving the
        repository, or a change to a protected path (ProtectedPathChanged)."""
        if bundle is None or not bundle.exists():
            return self.tip(branch)
        incoming = f"refs/autopilot/incoming/{branch.branch}"
        with repo_lock(branch.mirror):
            try:
                self.git.run(
                    [
                        "-c",
                        "transfer.fsckObjects=true",
                        "fetch",
                        "--quiet",
                        "--no-tags",
                        "--end-of-options",
                        str(bundle),
                        f"+HEAD:{incoming}",
                    ],
                    branch.mirror,
                )
            except GitFailed as exc:
                raise AgentWorkRefused(
                    f"the agent's commits cannot be taken: {exc.detail}"
                ) from None
            head = self.git.run(["rev-parse", "--verify", f"{incoming}^{{commit}}"], branch.mirror)
            self.git.ok(["update-ref", "-d", incoming], branch.mirror)
            if hidden:  # cut from the scratch root: put back on the base, hidden paths and all
                head = scratch.onto_base(self.git, branch, head, hidden)
            if not self.git.ok(
                ["merge-base", "--is-ancestor", branch.base_sha, head], branch.mirror
            ):
                raise AgentWorkRefused(
                    f"the agent's head {head[:12]} does not descend from the base "
                    f"{branch.base_sha[:12]}; it may add commits, not rewrite history"
                )
            problems = protected.forbidden_entries(
                lambda args: self.git.run(args, branch.mirror), branch.base_sha, head
            )
            if problems:
                raise AgentWorkRefused(
                    "the agent's change is refused: " + "; ".join(problems[:10]), paths=problems
                )
            self.check_protected(branch, ref=head)
            self.git.run(["update-ref", branch.ref, head], branch.mirror)
        self._at(branch, head)
        return head

    def check_protected(
        self, branch: CycleBranch, *, ref: str | None = None, allowed: Sequence[str] = ()
    ) -> protected.Check:
        """Raise `ProtectedPathChanged` if commit `ref` (default: the branch's tip) differs
        from the base in any protected path; return the hashes checked otherwise."""
        result = protected.check(
            lambda args: self.git.run(args, branch.mirror),
            branch.base_sha,
            ref=ref or branch.ref,
            allowed=allowed,
        )
        result.raise_for_violations()
        return result

    def commit_files(
        self,
        branch: CycleBranch,
        files: Mapping[str, bytes],
        message: str,
        *,
        allowed: Sequence[str] = (),
    ) -> str:
        """Commit `files` (repository path → content) on top of the branch's tip, through a
        private index: no working tree is read. Idempotent: when the tip already holds exactly
        these files it is returned unchanged."""
        self._tmp.mkdir(parents=True, exist_ok=True)
        # Objects are written without the mirror's lock (git writes each atomically, and one
        # advancer per cycle owns its branch): only the ref update, a compare-and-swap on the
        # parent, takes it, so cycles of one project commit side by side.
        with tempfile.TemporaryDirectory(dir=self._tmp) as tmp:
            index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            parent = self.tip(branch)
            paths = sorted(files)
            for path in paths:
                if path.startswith(("/", "-")) or ".." in path.split("/") or "\0" in path:
                    raise InvalidRef(f"{path!r} cannot be committed: a path inside the repository")
            self.git.run(["read-tree", parent], branch.mirror, extra_env=index)
            # One git for all the blobs and one for the index (not two a file): the contents
            # go through this private directory, hashed as they are (as `--stdin` hashed them).
            sources = [Path(tmp) / f"blob-{number}" for number in range(len(paths))]
            for source, path in zip(sources, paths, strict=True):
                source.write_bytes(files[path])
            listed = "".join(f"{source}\n" for source in sources).encode()
            hashed = ["hash-object", "-w", "--no-filters", "--stdin-paths"]
            blobs = self.git.run_bytes(hashed, branch.mirror, stdin=listed).decode().split()
            # `--cacheinfo` per path, not `--index-info`: that one skips a path it finds invalid
            # (`a//b`) and settles a file/directory clash by deleting, both with exit 0; this
            # fails the commit instead, as a commit of one file each did.
            entries = [
                arg
                for blob, path in zip(blobs, paths, strict=True)
                for arg in ("--cacheinfo", f"100644,{blob},{path}")
            ]
            self.git.run(["update-index", "--add", *entries], branch.mirror, extra_env=index)
            tree = self.git.run(["write-tree"], branch.mirror, extra_env=index)
            if tree == self.git.run(["rev-parse", f"{parent}^{{tree}}"], branch.mirror):
                return parent
            sha = self.git.run(
                ["commit-tree", tree, "-p", parent, "-m", message], branch.mirror, identity=True
            )
            self.check_protected(branch, ref=sha, allowed=allowed)
            with repo_lock(branch.mirror):
                self.git.run(["update-ref", branch.ref, sha, parent], branch.mirror)
        self._at(branch, sha)
        return sha

    def push(self, branch: CycleBranch, url: str, *, allowed: Sequence[str] = ()) -> str:
        """Push the cycle's branch; retries transient failures with backoff. Returns the sha.

        The pushed commit is checked against the protected paths once more, so nothing slips
        a changed judge past the earlier checks."""
        check_url(url)
        sha = self.tip(branch)
        if sha != branch.base_sha:  # the base itself changes no protected path
            self.check_protected(branch, ref=sha, allowed=allowed)
        refspec = f"{branch.ref}:{branch.ref}"
        delay = self._push_backoff_s
        for attempt in range(1, self._push_attempts + 1):
            try:
                self.git.run(["push", "--end-of-options", url, refspec], branch.mirror, url=url)
                return sha
            except GitFailed as exc:
                lowered = exc.detail.lower()
                if any(marker in lowered for marker in _REJECTED):
                    raise PushRejected(
                        f"the remote rejected branch {branch.branch}: {exc.detail}",
                        branch=branch.branch,
                    ) from None
                if attempt == self._push_attempts:
                    raise PushFailed(
                        f"pushing {branch.branch} failed {attempt} times; last error: {exc.detail}",
                        branch=branch.branch,
                    ) from None
                log.warning(
                    "push of %s failed (attempt %d), retrying in %.1f s: %s",
                    branch.branch,
                    attempt,
                    delay,
                    exc.detail,
                )
                self._sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    # -- re-validation on a moved base ----------------------------------------------------

    def merge_commit(self, project: str, url: str, head: str, base_sha: str) -> str:
        """The commit a merge of branch `head` onto `base_sha` would produce, made from objects
        (`git merge-tree --write-tree`, no checkout), for re-validating a result on a base that
        moved. Raises MergeConflict when it does not merge cleanly."""
        check_branch_name(head)
        check_sha(base_sha)
        mirror = self.fetch(project, url)
        remote_head = f"{REMOTE_PREFIX}{head}"
        try:
            tree = self.git.run(
                ["merge-tree", "--write-tree", "--no-messages", base_sha, remote_head], mirror
            ).splitlines()[0]
        except GitFailed as exc:
            raise MergeConflict(
                f"{head} does not merge cleanly onto {base_sha[:12]}: {exc.detail}"
            ) from None
        return self.git.run(
            [
                "commit-tree",
                tree,
                "-p",
                base_sha,
                "-p",
                remote_head,
                "-m",
                f"Merge {head} onto {base_sha[:12]} (re-validation)",
            ],
            mirror,
            identity=True,
        )

    def push_commit(self, project: str, commit: str, url: str, branch: str) -> str:
        """Push a commit of the mirror (a re-validation merge) to `branch` of the forge, so GPU
        hosts can fetch it; the branch is the autopilot's own and is overwritten."""
        check_url(url)
        check_branch_name(branch)
        check_sha(commit)
        try:
            self.git.run(
                ["push", "--force", "--end-of-options", url, f"{commit}:refs/heads/{branch}"],
                self.mirror_path(project),
                url=url,
            )
        except GitFailed as exc:
            raise PushFailed(f"pushing {branch} failed: {exc.detail}", branch=branch) from None
        return commit
