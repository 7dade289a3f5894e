"""The forge interface: where a cycle's branch becomes a pull request a person can review."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

PullRequestState = Literal["open", "closed", "merged"]
#: A commit status's state, as GitHub names them.
CommitState = Literal["success", "failure", "error", "pending"]


@dataclass(frozen=True)
class ProjectRef:
    """The few project fields a forge needs, detached from any DB session."""

    name: str
    repo_url: str
    default_branch: str = "main"

    @classmethod
    def of(cls, project: ProjectLike) -> ProjectRef:
        return cls(project.name, project.repo_url, project.default_branch)


class ProjectLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def repo_url(self) -> str: ...
    @property
    def default_branch(self) -> str: ...


@dataclass(frozen=True)
class PullRequest:
    project: str
    number: int
    url: str
    head: str
    base: str
    title: str
    body: str
    state: PullRequestState
    head_sha: str | None = None
    merge_sha: str | None = None


@dataclass(frozen=True)
class ForgeDecision:
    """What people decided on a pull request on the forge: its state, who merged or closed it
    (a forge login; None while open or unknown) and the last note a person left on it."""

    state: PullRequestState
    actor: str | None
    note: str


class Forge(Protocol):
    """A pull-request host. `open_pull_request` is idempotent: one open PR per head branch."""

    def remote_url(self, project: ProjectRef) -> str:
        """The URL cycles fetch from and push their branches to."""
        ...

    def fetch_url(self, project: ProjectRef) -> str:
        """The URL GPU hosts fetch a job's commit from (they never see the control host's
        disk): the API's git endpoint for the local forge, the repository itself for GitHub."""
        ...

    def sync_base(self, project: ProjectRef) -> None:
        """Bring the forge's copy of the base branch up to the project's repository, where the
        forge keeps a copy of its own (the local forge); a no-op where the repository is the
        forge (GitHub)."""
        ...

    def place_branch(self, project: ProjectRef, branch: str, sha: str) -> bool:
        """Create `branch` at a commit the forge already holds (a sweep's candidate is its base),
        without a push: True when done, False where a push is needed instead (the commit is not
        there, the branch exists, or the forge has no such shortcut)."""
        ...

    def take_branch(self, project: ProjectRef, mirror: Path, branch: str, sha: str) -> bool:
        """Fast-forward `branch` to commit `sha` of `mirror`, a repository on this host, without
        a push: True when done, False where a push is needed instead (the forge is elsewhere,
        the branch is not there yet, it is not a fast-forward)."""
        ...

    def file_url(self, project: ProjectRef, sha: str, path: str) -> str | None:
        """A web page of the file at `path` in commit `sha` that people can open, or None
        where the forge has no web view of files (the local forge: the dashboard shows them)."""
        ...

    def open_pull_request(
        self, project: ProjectRef, head: str, base: str, title: str, body: str
    ) -> PullRequest: ...

    def get_pull_request(self, project: ProjectRef, number: int) -> PullRequest: ...

    def comment(self, project: ProjectRef, number: int, body: str) -> None: ...

    def merge(
        self,
        project: ProjectRef,
        number: int,
        *,
        message: str | None = None,
        expected_head_sha: str | None = None,
    ) -> PullRequest: ...

    def close(self, project: ProjectRef, number: int) -> PullRequest: ...

    def set_commit_status(
        self,
        project: ProjectRef,
        sha: str,
        state: CommitState,
        description: str,
        target_url: str,
        context: str,
    ) -> None:
        """Show a verdict on commit `sha` where the forge has commit statuses (GitHub); a
        no-op elsewhere (the local forge: the dashboard shows it)."""
        ...
