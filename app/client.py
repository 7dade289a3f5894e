"""A small client of the control host's REST API: a base URL and a bearer token over httpx.

The CLI's remote commands (`autopilot --api URL ...`) and the GPU host's log upload
(`workers.control_client`) speak to the API through it. Its errors name the URL and the reason,
never the token: a chained httpx error carries the request with its headers, so none is chained.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from app.redaction import redact_text

API_PREFIX = "/api/v1"
# Connecting fails fast: an unreachable control host is said within seconds.
TIMEOUT = httpx.Timeout(30.0, connect=5.0)


class ApiUnreachable(Exception):
    """Nothing answered at the API's URL (refused, no route, timed out, TLS failed)."""


class ApiRefused(Exception):
    """The API answered with an error (problem+json); `status` and `detail` say which."""

    def __init__(self, url: str, status: int, detail: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {detail}")
        self.url, self.status, self.detail = url, status, detail


def problem_detail(response: httpx.Response) -> str:
    """The problem's `detail` when the answer is problem+json, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])
    return response.text[:200]


def without_token(message: str, token: str) -> str:
    """`message` with the token masked: defence in depth, as neither an answer nor an httpx error
    should echo it, but a message that leaves this module never holds it."""
    return message.replace(token, "***") if token else message


class ControlClient:
    """The API at `base_url` (e.g. http://control.lab:8000), reached with `token`."""

    def __init__(self, base_url: str, token: str, *, timeout: httpx.Timeout = TIMEOUT) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._http = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            follow_redirects=False,  # a redirect must not carry the token to another host
        )

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> Any:
        """GET `path` (under /api/v1) with the query `params` that are not None; its JSON."""
        return self._checked(self._send("GET", path, params=_given(params))).json()

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self._checked(self._send("POST", path, json=body)).json()

    @contextmanager
    def stream(self, path: str, **params: Any) -> Iterator[httpx.Response]:
        """A streamed GET: the caller reads the body as it comes (a log, server-sent events)."""
        try:
            with self._http.stream("GET", path, params=_given(params), timeout=None) as answer:
                if answer.status_code >= 400:
                    answer.read()
                self._checked(answer)
                yield answer
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _checked(self, answer: httpx.Response) -> httpx.Response:
        if answer.status_code >= 400:
            detail = without_token(problem_detail(answer), self._token)
            raise ApiRefused(redact_text(self.base_url), answer.status_code, detail)
        return answer

    def _unreachable(self, exc: httpx.HTTPError) -> ApiUnreachable:
        reason = without_token(f"{type(exc).__name__}: {exc}".rstrip(": "), self._token)
        return ApiUnreachable(f"{redact_text(self.base_url)} ({redact_text(reason)})")


def _given(params: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if v is not None}
