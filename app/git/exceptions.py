"""Errors of git work: each names what went wrong and what to do about it."""

from __future__ import annotations

from app.errors import (
    AutopilotError,
    Conflict,
    InvalidInput,
    NotFound,
    Unavailable,
)


class InvalidRef(InvalidInput):
    slug = "invalid-ref"
    title = "Invalid git ref"


class TransportNotAllowed(InvalidInput):
    slug = "transport-not-allowed"
    title = "Repository transport not allowed"


class GitFailed(AutopilotError):
    """A git command failed; the detail holds its redacted stderr."""

    status = 502
    slug = "git-failed"
    title = "Git command failed"


class FetchFailed(GitFailed, Unavailable):
    """A fetch from the project's repository failed (host down, auth refused): it may pass, so a
    cycle retries it with backoff before it fails with git's last line."""

    status = 503
    slug = "fetch-failed"
    title = "Fetching the repository failed"


class BaseBranchMissing(NotFound):
    slug = "base-branch-missing"
    title = "Base branch not found on the remote"


class PushRejected(AutopilotError):
    """The remote refused the push (a hook, a protected branch, a non-fast-forward): no retry."""

    status = 502
    slug = "push-rejected"
    title = "The remote rejected the push"


class PushFailed(Unavailable):
    """The push kept failing for a transient reason (network, server) after every retry."""

    slug = "push-failed"
    title = "Push failed after retries"


class ProtectedPathChanged(AutopilotError):
    """The change touches a path the agent may not change (the harness, the evaluation, data)."""

    status = 422
    slug = "protected-path-changed"
    title = "A protected path was changed"


class AgentWorkRefused(AutopilotError):
    """The agent's commits cannot become the cycle's candidate: they rewrite history, add git
    internals, bytecode or a submodule, or a symlink that leaves the repository."""

    status = 422
    slug = "agent-work-refused"
    title = "The agent's change was refused"


class MergeConflict(Conflict):
    slug = "merge-conflict"
    title = "Merge conflict"
