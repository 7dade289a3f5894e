"""The local forge: a bare repository per project as the remote, pull requests in the ops DB.

It serves the embedded default and air-gapped labs; the dashboard is where its PRs are reviewed.
Each method opens its own short unit of work and never holds a transaction across a git call:
the forge interface is the same as GitHub's, an outside effect the cycle calls between steps.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

from sqlalchemy.exc import IntegrityError

from app.clock import utcnow
from app.db import Stores
from app.forge import repository
from app.forge.base import CommitState, ProjectRef, PullRequest, PullRequestState
from app.forge.exceptions import (
    ForgeUnavailable,
    HeadMoved,
    PullRequestNotFound,
    PullRequestNotOpen,
)
from app.forge.lifecycle import PULL_REQUEST
from app.forge.models import PullRequestComment, PullRequestRecord
from app.git import objects
from app.git.exceptions import GitFailed, InvalidRef, MergeConflict
from app.git.refs import check_sha
from app.git.runner import (
    GitRunner,
    check_branch_name,
    check_url,
    fetch_failure,
    repo_lock,
    single_flight,
    upkeep,
)
from app.projects import schemas as ops_schemas
from app.settings import Settings

log = logging.getLogger(__name__)

# Where the API serves the forge's repositories: <control url>/git/<project>.git
HTTP_PREFIX = "/git"
#: Tries at recording a PR when other processes take the project's next number meanwhile.
OPEN_ATTEMPTS = 6
_NUMBERING_LOCKS: dict[str, threading.Lock] = {}
_NUMBERING_GUARD = threading.Lock()


def _numbering(project: str) -> threading.Lock:
    """This process's lock on numbering `project`'s pull requests."""
    with _NUMBERING_GUARD:
        return _NUMBERING_LOCKS.setdefault(project, threading.Lock())


def _to_pull_request(row: PullRequestRecord, url: str) -> PullRequest:
    state: PullRequestState = row.state  # type: ignore[assignment]
    return PullRequest(
        project=row.project,
        number=row.number,
        url=url,
        head=row.head,
        base=row.base,
        title=row.title,
        body=row.body,
        state=state,
        head_sha=row.head_sha,
        merge_sha=row.merge_sha,
    )


class LocalForge:
    """Bare repositories under `<state>/forge/<project>.git`; PR records in the ops DB."""

    def __init__(self, settings: Settings, stores: Stores) -> None:
        self.root = settings.state_dir.absolute() / "forge"
        self._control_url = settings.control_url
        self._tmp = settings.state_dir.absolute() / "tmp"
        self._stores = stores
        self.git = GitRunner(author=(settings.git_author_name, settings.git_author_email))

    # -- the remote -------------------------------------------------------------------------

    def bare_path(self, project: ProjectRef) -> Path:
        try:
            ops_schemas.check_slug(project.name, "project")
        except ValueError as exc:
            raise InvalidRef(str(exc)) from None
        return self.root / f"{project.name}.git"

    def http_url(self, project: ProjectRef, control_url: str) -> str:
        """The repository as git's smart HTTP serves it from the API (app/forge/router.py): what
        a GPU host fetches with its worker token, e.g. `http://control:8000/git/spectral.git`."""
        self.bare_path(project)  # the same slug check: nothing else reaches a URL path
        return f"{control_url.rstrip('/')}{HTTP_PREFIX}/{project.name}.git"

    def fetch_url(self, project: ProjectRef) -> str:
        return self.http_url(project, self._control_url)

    def remote_url(self, project: ProjectRef) -> str:
        """The bare repository, seeded once from the project's repo_url."""
        bare = self.bare_path(project)
        if (bare / "HEAD").exists():
            return str(bare)
        check_url(project.repo_url)
        with repo_lock(bare):
            if not (bare / "HEAD").exists():
                self.root.mkdir(parents=True, exist_ok=True)
                staging = Path(tempfile.mkdtemp(prefix=f".{project.name}-", dir=self.root))
                try:
                    self.git.run(
                        [
                            "clone",
                            "--bare",
                            "--quiet",
                            "--end-of-options",
                            project.repo_url,
                            str(staging / "repo.git"),
                        ],
                        self.root,
                        url=project.repo_url,
                    )
                    (staging / "repo.git").rename(bare)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
        return str(bare)

    def sync_base(self, project: ProjectRef) -> None:
        """Fast-forward the forge's base branch to the project's repository: upstream commits
        reach the next cycle, while a base that moved here (a merged PR) is kept as it is."""
        bare = Path(self.remote_url(project))
        branch = check_branch_name(project.default_branch)
        # Cycles planned at once share one fetch (gitrunner.single_flight).
        with single_flight(bare, f"{project.repo_url} {branch}") as needed:
            if not needed:
                return
            try:
                self.git.run(
                    [
                        "fetch",
                        "--quiet",
                        "--no-tags",
                        "--end-of-options",
                        project.repo_url,
                        f"refs/heads/{branch}:refs/heads/{branch}",
                    ],
                    bare,
                    url=project.repo_url,
                )
            except GitFailed as exc:
                if "non-fast-forward" in exc.detail or "[rejected]" in exc.detail:
                    log.info("forge base of %s is ahead of its repository: kept", project.name)
                    return
                raise fetch_failure(exc, project.repo_url) from None

    def place_branch(self, project: ProjectRef, branch: str, sha: str) -> bool:
        """One `update-ref` in the bare repository instead of a push (a dozen processes with
        what it spawns): `""` as the old value makes it only where the branch does not exist,
        and git refuses a commit the repository does not hold."""
        check_branch_name(branch)
        check_sha(sha)
        try:
            self.git.run(
                ["update-ref", f"refs/heads/{branch}", sha, ""], Path(self.remote_url(project))
            )
        except GitFailed:
            return False
        return True

    def take_branch(self, project: ProjectRef, mirror: Path, branch: str, sha: str) -> bool:
        """Fast-forward `branch` to `sha`, a commit of `mirror` (a repository on this host),
        by copying the objects a push would send and one `update-ref` (`objects.copy_new`):
        True when done; False where a push must do it (the branch is not here yet, `sha` is
        not a fast-forward of it, an object is packed, or the branch moved meanwhile)."""
        check_branch_name(branch)
        check_sha(sha)
        bare = Path(self.remote_url(project))
        ref = f"refs/heads/{branch}"
        old = self.git.ref_tips(bare, ref).get(ref)
        if old is None:
            return False
        if old == sha:
            return True
        if old not in (objects.parents(mirror, sha) or ()) and not self.git.ok(
            ["merge-base", "--is-ancestor", old, sha], mirror
        ):
            return False  # not a fast-forward
        if not objects.copy_new(self.git, mirror, bare, sha, old):
            return False
        try:
            self.git.run(["update-ref", ref, sha, old], bare)
        except GitFailed:
            return False
        if upkeep.due(bare):
            self.git.maintain(bare)
        return True

    def _sha(self, bare: Path, branch: str) -> str | None:
        try:
            return self.git.run(
                ["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], bare
            )
        except GitFailed:
            return None

    def file_url(self, project: ProjectRef, sha: str, path: str) -> str | None:
        return None  # no web view of its own: the dashboard's cycle page shows the files

    def _url(self, project: str, number: int) -> str:
        return f"local://{project}/pulls/{number}"

    # -- pull requests ------------------------------------------------------------------------

    def open_pull_request(
        self, project: ProjectRef, head: str, base: str, title: str, body: str
    ) -> PullRequest:
        """The open PR for `head`, created if there is none. Never a second one."""
        check_branch_name(head)
        check_branch_name(base)
        bare = Path(self.remote_url(project))
        with self._stores.ops_session() as session:
            row = repository.find_open_by_head(session, project.name, head)
            if row is not None:
                return _to_pull_request(row, self._url(row.project, row.number))
        tips = self.git.ref_tips(bare, f"refs/heads/{head}", f"refs/heads/{base}")
        head_sha, base_sha = tips.get(f"refs/heads/{head}"), tips.get(f"refs/heads/{base}")
        if head_sha is None:
            raise InvalidRef(f"branch {head!r} is not on the forge; push it before opening a PR")
        if base_sha is None:
            raise InvalidRef(f"base branch {base!r} is not on the forge")
        # A project's next number is read and taken in one transaction, committed before this
        # process's next open of the project reads it (its control threads publish side by
        # side); another process taking it meanwhile is a unique violation, tried again.
        for attempt in range(OPEN_ATTEMPTS):
            try:
                with _numbering(project.name), self._stores.ops_session() as session:
                    row = repository.find_open_by_head(session, project.name, head)
                    if row is None:
                        row = PullRequestRecord(
                            project=project.name,
                            number=repository.next_number(session, project.name),
                            head=head,
                            base=base,
                            title=title[:512],
                            body=body,
                            state="open",
                            head_sha=head_sha,
                            base_sha=base_sha,
                        )
                        repository.add(session, row)
                    return _to_pull_request(row, self._url(row.project, row.number))
            except IntegrityError:
                time.sleep(random.uniform(0, 0.01 * 2**attempt))  # noqa: S311 - jitter only
        # Transient (Unavailable): the cycle's publish step is retried with backoff.
        raise ForgeUnavailable(f"could not record a pull request for {head!r}; try again")

    def _get_row(self, project: ProjectRef, number: int) -> PullRequestRecord:
        with self._stores.ops_session() as session:
            row = repository.get(session, project.name, number)
            if row is None:
                raise PullRequestNotFound(f"project {project.name!r} has no pull request #{number}")
            return row

    def get_pull_request(self, project: ProjectRef, number: int) -> PullRequest:
        row = self._get_row(project, number)
        pr = _to_pull_request(row, self._url(row.project, row.number))
        if pr.state == "open":
            # The head branch may have received pushes since the PR was opened.
            current = self._sha(self.bare_path(project), pr.head)
            if current and current != pr.head_sha:
                with self._stores.ops_session() as session:
                    fresh = repository.get(session, project.name, number)
                    assert fresh is not None
                    fresh.head_sha = current
                    fresh.updated_at = utcnow()
                pr = _to_pull_request(fresh, pr.url)
        return pr

    def comments(self, project: ProjectRef, number: int) -> list[str]:
        with self._stores.ops_session() as session:
            row = repository.get(session, project.name, number)
            if row is None:
                raise PullRequestNotFound(f"project {project.name!r} has no pull request #{number}")
            return [c.body for c in repository.comments(session, row.id)]

    def comment(self, project: ProjectRef, number: int, body: str) -> None:
        with self._stores.ops_session() as session:
            row = repository.get(session, project.name, number)
            if row is None:
                raise PullRequestNotFound(f"project {project.name!r} has no pull request #{number}")
            repository.add(session, PullRequestComment(pull_request_id=row.id, body=body))

    def diff(self, project: ProjectRef, number: int) -> str:
        """What the PR would bring into its base: `git diff base...head` in the bare repo."""
        pr = self.get_pull_request(project, number)
        bare = self.bare_path(project)
        if pr.state == "merged" and pr.merge_sha:
            return self.git.run(["diff", f"{pr.merge_sha}^1", pr.merge_sha, "--"], bare)
        head = pr.head_sha or f"refs/heads/{pr.head}"
        return self.git.run(["diff", f"refs/heads/{pr.base}...{head}", "--"], bare)

    def set_commit_status(
        self,
        project: ProjectRef,
        sha: str,
        state: CommitState,
        description: str,
        target_url: str,
        context: str,
    ) -> None:
        return None  # no commit statuses here: the dashboard shows the verdict

    def close(self, project: ProjectRef, number: int) -> PullRequest:
        with self._stores.ops_session() as session:
            row = repository.get(session, project.name, number)
            if row is None:
                raise PullRequestNotFound(f"project {project.name!r} has no pull request #{number}")
            if row.state == "open":
                now = utcnow()
                PULL_REQUEST.move(row, "closed", closed_at=now, updated_at=now)
                session.flush()
            return _to_pull_request(row, self._url(row.project, row.number))

    def merge(
        self,
        project: ProjectRef,
        number: int,
        *,
        message: str | None = None,
        expected_head_sha: str | None = None,
    ) -> PullRequest:
        """A merge commit (`--no-ff`) of the head into the base, made from objects in the bare
        repo; the base ref moves only if nobody moved it meanwhile."""
        pr = self.get_pull_request(project, number)
        if pr.state == "merged":
            return pr
        if pr.state != "open":
            raise PullRequestNotOpen(f"pull request #{number} is {pr.state}; reopen it first")
        if expected_head_sha and pr.head_sha != expected_head_sha:
            raise HeadMoved(
                f"#{number}'s head is {pr.head_sha}, not the reviewed {expected_head_sha}; "
                "review the new commits first"
            )
        bare = self.bare_path(project)
        with repo_lock(bare):
            base_sha = self._sha(bare, pr.base)
            if base_sha is None or pr.head_sha is None:
                raise InvalidRef(f"#{number}: branch {pr.base!r} or {pr.head!r} is gone")
            try:
                # Made from objects (no checkout): nothing of the branch's tree is run or read
                # as configuration on this host.
                tree = self.git.run(
                    ["merge-tree", "--write-tree", "--no-messages", base_sha, pr.head_sha], bare
                ).splitlines()[0]
            except GitFailed as exc:
                raise MergeConflict(
                    f"#{number} does not merge cleanly into {pr.base}: {exc.detail}; "
                    "rebase the branch or re-run the cycle on the new base"
                ) from None
            merge_sha = self.git.run(
                [
                    "commit-tree",
                    tree,
                    "-p",
                    base_sha,
                    "-p",
                    pr.head_sha,
                    "-m",
                    message or f"Merge pull request #{number} from {pr.head}",
                ],
                bare,
                identity=True,
            )
            # Compare-and-swap: fails if the base moved since we read it.
            self.git.run(
                [
                    "update-ref",
                    "-m",
                    f"merge #{number}",
                    f"refs/heads/{pr.base}",
                    merge_sha,
                    base_sha,
                ],
                bare,
            )
        with self._stores.ops_session() as session:
            row = repository.get(session, project.name, number)
            assert row is not None
            now = utcnow()
            PULL_REQUEST.move(row, "merged", merge_sha=merge_sha, closed_at=now, updated_at=now)
            session.flush()
            return _to_pull_request(row, self._url(row.project, row.number))

    def list_pull_requests(self, project: ProjectRef) -> list[PullRequest]:
        with self._stores.ops_session() as session:
            return [
                _to_pull_request(r, self._url(r.project, r.number))
                for r in repository.list_for_project(session, project.name)
            ]
