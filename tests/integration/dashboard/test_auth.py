"""Signing in with a token, the signed session cookie, CSRF on every form, logout."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import SecretStr
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.settings import Settings
from tests.integration.dashboard.conftest import build_app, csrf_of, login

PAGES = [
    "/dashboard/",
    "/dashboard/cycles",
    "/dashboard/queue",
    "/dashboard/memory",
    "/dashboard/cycles/1",
    "/dashboard/memory/abc",
]


def test_root_redirects_and_every_page_asks_to_sign_in(client: TestClient) -> None:
    root = client.get("/", follow_redirects=False)
    assert root.status_code == 307 and root.headers["location"] == "/dashboard/"
    for path in PAGES:
        response = client.get(path, follow_redirects=False)
        assert response.status_code == 303, path
        assert response.headers["location"].startswith("/dashboard/login?next=%2Fdashboard%2F")
    plot = client.get("/dashboard/cycles/1/plot.svg")
    assert plot.status_code == 401


def test_login_sets_a_signed_httponly_lax_cookie_and_lands_on_next(
    client: TestClient, tokens: dict[str, str]
) -> None:
    form = client.get("/dashboard/login?next=/dashboard/queue")
    assert 'type="password"' in form.text and 'value="/dashboard/queue"' in form.text
    done = client.post(
        "/dashboard/login",
        follow_redirects=False,
        data={
            "token": tokens["reader"],
            "csrf_token": csrf_of(form.text),
            "next": "/dashboard/queue",
        },
    )
    assert done.status_code == 303 and done.headers["location"] == "/dashboard/queue"
    cookie = next(
        v
        for k, v in done.headers.multi_items()
        if k == "set-cookie" and v.startswith("autopilot_session=")
    )
    lowered = cookie.lower()
    assert "httponly" in lowered and "samesite=lax" in lowered and "path=/dashboard" in lowered
    assert "secure" not in lowered  # plain http: a Secure cookie would never come back
    assert tokens["reader"] not in cookie  # the token itself is never in the cookie
    page = client.get("/dashboard/queue")
    assert page.status_code == 200 and "bob" in page.text


def test_cookie_is_secure_over_https(app: FastAPI, tokens: dict[str, str]) -> None:
    with TestClient(app, base_url="https://dash.example") as client:
        form = client.get("/dashboard/login")
        done = client.post(
            "/dashboard/login",
            follow_redirects=False,
            data={"token": tokens["review"], "csrf_token": csrf_of(form.text), "next": ""},
        )
        cookie = next(
            v
            for k, v in done.headers.multi_items()
            if k == "set-cookie" and v.startswith("autopilot_session=")
        )
        assert "secure" in cookie.lower()


def test_bad_token_missing_csrf_and_foreign_origin_are_refused(
    client: TestClient, tokens: dict[str, str]
) -> None:
    form = client.get("/dashboard/login")
    csrf = csrf_of(form.text)
    bad = client.post("/dashboard/login", data={"token": "nope", "csrf_token": csrf})
    assert bad.status_code == 401 and "not valid or was revoked" in bad.text
    no_csrf = client.post("/dashboard/login", data={"token": tokens["review"]})
    assert no_csrf.status_code == 403 and "autopilot_session" not in no_csrf.headers.get(
        "set-cookie", ""
    )
    foreign = client.post(
        "/dashboard/login",
        headers={"Origin": "http://evil.example"},
        data={"token": tokens["review"], "csrf_token": csrf},
    )
    assert foreign.status_code == 403
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303


def test_next_never_leaves_the_dashboard(client: TestClient, tokens: dict[str, str]) -> None:
    for target in ("//evil.example/x", "https://evil.example/", "/dashboard\\..", "/api/v1/x"):
        client.cookies.clear()
        form = client.get("/dashboard/login")
        done = client.post(
            "/dashboard/login",
            follow_redirects=False,
            data={"token": tokens["reader"], "csrf_token": csrf_of(form.text), "next": target},
        )
        assert done.headers["location"] == "/dashboard/", target


def test_tampered_cookie_and_revoked_token_end_the_session(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    login(client, tokens["admin"])
    good = client.cookies.get("autopilot_session")
    assert good
    body, _, mac = good.partition(".")
    # Replace the cookie itself (same domain and path): a second cookie of the same name
    # would be sent beside it, in an order the server need not honour.
    (domain,) = {c.domain for c in client.cookies.jar if c.name == "autopilot_session"}
    client.cookies.set("autopilot_session", body + "x." + mac, domain=domain, path="/dashboard")
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303
    client.cookies.set("autopilot_session", good, domain=domain, path="/dashboard")
    assert client.get("/dashboard/", follow_redirects=False).status_code == 200
    with stores.ops_session() as session:
        ops.revoke_token(session, "root")
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303


def test_logout_needs_the_csrf_token_and_clears_the_session(
    client: TestClient, tokens: dict[str, str]
) -> None:
    csrf = login(client, tokens["review"])
    copied = client.cookies.get("autopilot_session")
    refused = client.post("/dashboard/logout", data={"csrf_token": "forged"})
    assert refused.status_code == 403
    assert client.get("/dashboard/", follow_redirects=False).status_code == 200
    out = client.post("/dashboard/logout", data={"csrf_token": csrf}, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/dashboard/login"
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303
    # a copy of the old cookie no longer works: logout ended the sign-in on the server
    (domain,) = {c.domain for c in client.cookies.jar} or {"testserver.local"}
    client.cookies.set("autopilot_session", copied or "", domain=domain, path="/dashboard")
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303


def test_cookies_are_secure_behind_a_trusted_tls_proxy_or_when_forced(
    settings: Settings, stores: Stores
) -> None:
    """Issue 20, item 8: X-Forwarded-Proto is believed from AUTOPILOT_TRUSTED_PROXIES only
    (uvicorn's proxy headers, as `autopilot serve` runs it), or AUTOPILOT_COOKIE_SECURE=always."""

    def cookie_through_proxy(app: Any) -> str:
        """The Set-Cookie of the sign-in page (its form's CSRF cookie), asked through a proxy
        that says the browser used HTTPS."""
        with TestClient(app) as client:
            form = client.get("/dashboard/login", headers={"X-Forwarded-Proto": "https"})
            assert form.status_code == 200
            return str(form.headers.get("set-cookie", ""))

    trusted = ProxyHeadersMiddleware(create_app(settings, stores), trusted_hosts=["testclient"])
    assert "secure" in cookie_through_proxy(trusted).lower()
    untrusted = ProxyHeadersMiddleware(create_app(settings, stores), trusted_hosts=["10.9.9.9"])
    assert "secure" not in cookie_through_proxy(untrusted).lower()
    forced = settings.model_copy(update={"cookie_secure": "always"})
    assert "secure" in cookie_through_proxy(create_app(forced, stores)).lower()


def test_generated_session_secret_is_persisted_owner_only(
    settings: Settings, stores: Stores, tokens: dict[str, str]
) -> None:
    assert settings.session_secret is None
    with TestClient(build_app(settings, stores)) as client:
        login(client, tokens["review"])
        cookie = client.cookies.get("autopilot_session")
    path = Path(settings.state_dir) / "session_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    # Another process (a restart) with the same state dir accepts the same cookie.
    with TestClient(build_app(settings, stores)) as again:
        again.cookies.set("autopilot_session", cookie or "", path="/dashboard")
        assert again.get("/dashboard/", follow_redirects=False).status_code == 200


def test_configured_secret_is_used_and_nothing_is_written(
    settings: Settings, stores: Stores, tokens: dict[str, str]
) -> None:
    configured = settings.model_copy(update={"session_secret": SecretStr("s" * 40)})
    with TestClient(build_app(configured, stores)) as client:
        login(client, tokens["review"])
        cookie = client.cookies.get("autopilot_session")
    assert not (Path(settings.state_dir) / "session_secret").exists()
    other = settings.model_copy(update={"session_secret": SecretStr("t" * 40)})
    with TestClient(build_app(other, stores)) as client:
        client.cookies.set("autopilot_session", cookie or "", path="/dashboard")
        assert client.get("/dashboard/", follow_redirects=False).status_code == 303


def test_a_worker_token_does_not_sign_in(client: TestClient, stores: Stores) -> None:
    """A GPU host's token (scope worker) fetches from the forge; it is no dashboard login."""
    with stores.ops_session() as session:
        worker = ops.create_token(session, "gpu-1", ["worker"])[1]
    form = client.get("/dashboard/login")
    refused = client.post(
        "/dashboard/login", data={"token": worker, "csrf_token": csrf_of(form.text)}
    )
    assert refused.status_code == 401
    assert "autopilot_session" not in refused.headers.get("set-cookie", "")
    assert client.get("/dashboard/", follow_redirects=False).status_code == 303
