"""Errors of git work and the forges: each names what went wrong and what to do about it."""

from __future__ import annotations

from app.errors import (
    AutopilotError,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    Unauthorized,
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


class PullRequestNotFound(NotFound):
    slug = "pull-request-not-found"
    title = "Pull request not found"


class PullRequestNotOpen(Conflict):
    slug = "pull-request-not-open"
    title = "Pull request is not open"


class MergeConflict(Conflict):
    slug = "merge-conflict"
    title = "Merge conflict"


class HeadMoved(Conflict):
    slug = "head-moved"
    title = "The pull request's head moved since it was reviewed"


class ForgeRejected(AutopilotError):
    """The forge answered with a client error we cannot retry (bad input, permissions)."""

    status = 502
    slug = "forge-rejected"
    title = "The forge rejected the request"


class ForgeUnavailable(Unavailable):
    slug = "forge-unavailable"
    title = "The forge is unavailable"


class ForgeRepositoryNotFound(NotFound):
    slug = "forge-repository-not-found"
    title = "No such repository on the forge"


class ForgeReadOnly(Forbidden):
    slug = "forge-read-only"
    title = "The forge is read-only over HTTP"


class ForgeCredentialsNeeded(Unauthorized):
    """A git client asks for credentials on a Basic challenge (a credential helper answers)."""

    challenge = 'Basic realm="autopilot"'


class ForgeBackendFailed(AutopilotError):
    """`git http-backend` ended without a response; the detail holds its redacted stderr."""

    status = 502
    slug = "forge-backend-failed"
    title = "The git HTTP backend failed"
