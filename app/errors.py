"""Domain exceptions carry their HTTP status and a stable problem `type` (RFC 9457).

Services raise these; the API turns them into `application/problem+json` in one handler, and
the CLI prints their detail and exits 2 (bad input) or 1 (anything else).
"""

from __future__ import annotations

from typing import Any

PROBLEM_BASE = "https://research-autopilot.dev/problems/"


class AutopilotError(Exception):
    """Base of every domain error. `detail` says what was wrong and what to do."""

    status: int = 400
    slug: str = "bad-request"
    title: str = "Bad request"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra

    def headers(self) -> dict[str, str] | None:
        """Response headers this error needs (a 401 names how to authenticate)."""
        return None

    @property
    def type(self) -> str:
        return PROBLEM_BASE + self.slug

    def problem(self, instance: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": self.type,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        body.update(self.extra)
        return body


class InvalidInput(AutopilotError):
    status = 422
    slug = "invalid-input"
    title = "Invalid input"


class NotFound(AutopilotError):
    status = 404
    slug = "not-found"
    title = "Not found"


class Conflict(AutopilotError):
    status = 409
    slug = "conflict"
    title = "Conflict"


class Unauthorized(AutopilotError):
    status = 401
    slug = "unauthorized"
    title = "Unauthorized"
    # The WWW-Authenticate challenge: the REST API takes a bearer token.
    challenge = "Bearer"

    def headers(self) -> dict[str, str] | None:
        return {"WWW-Authenticate": self.challenge}


class Forbidden(AutopilotError):
    status = 403
    slug = "forbidden"
    title = "Forbidden"


class Unavailable(AutopilotError):
    status = 503
    slug = "unavailable"
    title = "Service unavailable"
