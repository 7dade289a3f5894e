"""Errors of the forges (pull-request hosts): each names what went wrong and what to do."""

from __future__ import annotations

from app.errors import (
    AutopilotError,
    Conflict,
    Forbidden,
    NotFound,
    Unauthorized,
    Unavailable,
)


class PullRequestNotFound(NotFound):
    slug = "pull-request-not-found"
    title = "Pull request not found"


class PullRequestNotOpen(Conflict):
    slug = "pull-request-not-open"
    title = "Pull request is not open"


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


class WebhookNotConfigured(Unavailable):
    """No webhook secret is set: no delivery can be verified, so none is accepted."""

    slug = "webhook-not-configured"
    title = "The GitHub webhook is not configured"


class WebhookSignatureInvalid(AutopilotError):
    """The delivery's `X-Hub-Signature-256` is missing or is not the HMAC of its body."""

    status = 401
    slug = "webhook-signature-invalid"
    title = "The webhook delivery's signature does not match"


class WebhookTooLarge(AutopilotError):
    status = 413
    slug = "too-large"
    title = "Request too large"


class CommandNotAllowed(Forbidden):
    """An `/autopilot` command from a GitHub user who may not write to the repository."""

    slug = "command-not-allowed"
    title = "Not allowed to decide on this repository"
