"""Dashboard sign-in: an API token once, then an HMAC-signed session cookie bound to that token.

The cookie names the token row and a prefix of its hash, so revoking the token ends every
session made with it on the next request. Forms carry a CSRF token bound to the session.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import Request, Response

from app.api.deps import get_settings
from app.db import Stores
from app.errors import Forbidden, Unauthorized
from app.projects import service as ops
from app.projects.models import ApiToken
from app.settings import Settings

SESSION_COOKIE = "autopilot_session"
LOGIN_CSRF_COOKIE = "autopilot_login_csrf"
SESSION_MAX_AGE_S = 12 * 3600
SECRET_FILE = "session_secret"  # noqa: S105 - a file name, not a secret
PREFIX = "/dashboard"


@dataclass(frozen=True)
class Viewer:
    """Who is looking: the token's name and scopes, and the session's CSRF token."""

    name: str
    scopes: tuple[str, ...]
    csrf: str

    def can(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes


def session_secret(request: Request) -> bytes:
    """The signing key: the configured secret, else one generated once in the state dir."""
    cached: bytes | None = getattr(request.app.state, "dashboard_secret", None)
    if cached is not None:
        return cached
    secret = load_secret(get_settings(request))
    request.app.state.dashboard_secret = secret
    return secret


def load_secret(settings: Settings) -> bytes:
    if settings.session_secret is not None and settings.session_secret.get_secret_value():
        return settings.session_secret.get_secret_value().encode()
    path = settings.state_dir.absolute() / SECRET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two processes starting together agree on the first one's secret.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _read_secret(path)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(48))
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    value = path.read_text().strip()
    if len(value) < 32:
        raise RuntimeError(f"{path} holds a secret shorter than 32 characters; delete it")
    return value.encode()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(secret: bytes, payload: dict[str, Any]) -> str:
    body = _b64(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    mac = hmac.new(secret, body.encode(), hashlib.sha256).digest()
    return f"{body}.{_b64(mac)}"


def unsign(secret: bytes, value: str) -> dict[str, Any] | None:
    body, _, mac = value.partition(".")
    if not body or not mac:
        return None
    expected = _b64(hmac.new(secret, body.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, mac):
        return None
    try:
        payload = json.loads(_unb64(body))
    except (ValueError, UnicodeDecodeError):
        return None
    return payload if isinstance(payload, dict) else None


def _token_tag(token: ApiToken) -> str:
    return token.token_sha256[:24]


def login(stores: Stores, request: Request, response: Response, token_text: str) -> Viewer:
    """Check the API token and set the session cookie; Unauthorized if the token is not live."""
    with stores.ops_session() as session:
        token = ops.authenticate(session, token_text.strip() or None)
        try:
            ops.require_reader(token)  # a GPU host's worker token does not sign in
        except Forbidden as exc:
            raise Unauthorized(exc.detail) from None
        csrf = secrets.token_urlsafe(24)
        payload = {
            "tid": token.id,
            "tag": _token_tag(token),
            "sid": ops.start_signin(session, token, SESSION_MAX_AGE_S),
            "csrf": csrf,
            "exp": int(time.time()) + SESSION_MAX_AGE_S,
        }
        viewer = Viewer(token.name, tuple(token.scopes), csrf)
    response.set_cookie(
        SESSION_COOKIE,
        sign(session_secret(request), payload),
        max_age=SESSION_MAX_AGE_S,
        path=PREFIX,
        httponly=True,
        samesite="lax",
        secure=is_https(request),
    )
    response.delete_cookie(LOGIN_CSRF_COOKIE, path=PREFIX)
    return viewer


def logout(stores: Stores, request: Request, response: Response) -> None:
    """End the sign-in on the server (a copy of the cookie no longer works), then the cookie."""
    payload = unsign(session_secret(request), request.cookies.get(SESSION_COOKIE) or "")
    sid = payload.get("sid") if payload else None
    if isinstance(sid, str):
        with stores.ops_session() as session:
            ops.end_signin(session, sid)
    response.delete_cookie(SESSION_COOKIE, path=PREFIX)


def current_viewer(stores: Stores, request: Request) -> Viewer | None:
    """The signed-in viewer, re-checked against the token row on every request."""
    raw = request.cookies.get(SESSION_COOKIE)
    if not raw:
        return None
    payload = unsign(session_secret(request), raw)
    if payload is None or not isinstance(payload.get("exp"), int) or payload["exp"] < time.time():
        return None
    token_id, tag, csrf = payload.get("tid"), payload.get("tag"), payload.get("csrf")
    sid = payload.get("sid")
    if not isinstance(token_id, int) or not all(isinstance(v, str) for v in (tag, csrf, sid)):
        return None
    with stores.ops_session() as session:
        token = ops.get_token(session, token_id)
        if (
            token is None
            or token.revoked_at is not None
            or not hmac.compare_digest(_token_tag(token), str(tag))
            or not ops.live_signin(session, str(sid), token_id)  # logout ends it on the server
        ):
            return None
        return Viewer(token.name, tuple(token.scopes), str(csrf))


def is_https(request: Request) -> bool:
    """Whether the browser reached us over HTTPS, so cookies are `Secure`: the request's own
    scheme (uvicorn rewrites it from X-Forwarded-Proto only for AUTOPILOT_TRUSTED_PROXIES), or
    always with AUTOPILOT_COOKIE_SECURE=always (a TLS proxy whose address is not fixed)."""
    settings = getattr(request.app.state, "settings", None)
    if settings is not None and settings.cookie_secure == "always":
        return True
    return request.url.scheme == "https"


def login_csrf(request: Request) -> str:
    """The double-submit token of the login form (there is no session yet to bind it to)."""
    return request.cookies.get(LOGIN_CSRF_COOKIE) or secrets.token_urlsafe(24)


def set_login_csrf(request: Request, response: Response, value: str) -> None:
    response.set_cookie(
        LOGIN_CSRF_COOKIE,
        value,
        max_age=3600,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=is_https(request),
    )


def check_login_csrf(request: Request, submitted: str) -> bool:
    cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
    return bool(cookie) and hmac.compare_digest(cookie.encode(), submitted.encode())


def check_csrf(viewer: Viewer, submitted: str) -> bool:
    return bool(submitted) and hmac.compare_digest(viewer.csrf.encode(), submitted.encode())


def same_origin(request: Request) -> bool:
    """A browser's POST names its origin; one from another site is refused outright."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    # Behind a proxy that rewrites Host, the browser's host arrives as X-Forwarded-Host.
    hosts = {request.headers.get("host", ""), request.headers.get("x-forwarded-host", "")}
    return urlsplit(origin).netloc in hosts - {""}


def safe_next(target: str | None) -> str:
    """Only a path inside the dashboard: never another host (`//evil`, `/\\evil`)."""
    if (
        target
        and target.startswith(PREFIX + "/")
        and not target.startswith("//")
        and "\\" not in target
        and not any(ord(c) < 32 for c in target)
    ):
        return target
    return PREFIX + "/"
