"""Security rules that hold for the whole API, whatever routes are added later.

- every route in the OpenAPI document refuses a request without a token, except the few that
  are public on purpose (health, readiness, metrics, the API's own description);
- CORS is off unless AUTOPILOT_CORS_ORIGINS is set, and then only for those origins;
- a body over AUTOPILOT_MAX_REQUEST_BYTES is refused with 413 before it is read whole;
- no `shell=True` and no `os.system(` in the service's code (ruff's S602/S605 enforce it too).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.settings import Settings
from tests.support import bearer

# Routes anyone may call, each on purpose. Dashboard pages that must be public go here too.
PUBLIC: set[tuple[str, str]] = {
    ("get", "/healthz"),
    ("get", "/readyz"),
}
# Routes that take no token because a signature authenticates each request instead (GitHub's
# webhook: X-Hub-Signature-256): unsigned, they refuse and change nothing.
SIGNED: set[tuple[str, str]] = {("post", "/api/v1/webhooks/github")}
# Served by FastAPI itself and not listed in the document; they describe the API, hold no data.
DOCS = ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
ROOT = Path(__file__).resolve().parents[3]


def full_app(settings: Settings, stores: Stores) -> FastAPI:
    return create_app(settings, stores)


@pytest.fixture
def secured(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    with TestClient(full_app(settings, stores)) as client:
        yield client


def openapi_routes(client: TestClient) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    methods = {"get", "post", "put", "patch", "delete", "head", "options"}
    return [
        (method, path)
        for path, item in spec["paths"].items()
        for method in item
        if method in methods
    ]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def test_every_route_needs_a_token_unless_public(secured: TestClient) -> None:
    routes = openapi_routes(secured)
    assert len(routes) > len(PUBLIC), "the OpenAPI document lists almost nothing"
    open_routes = []
    for method, path in routes:
        if (method, path) in PUBLIC:
            continue
        response = secured.request(method, concrete(path), json={})
        if (method, path) in SIGNED:
            assert response.status_code in (401, 503), (method, path, response.status_code)
            continue
        if response.status_code != 401:
            open_routes.append((method, path, response.status_code))
            continue
        assert response.headers["content-type"] == "application/problem+json", (method, path)
        assert response.headers["www-authenticate"] == "Bearer", (method, path)
    assert open_routes == [], "answered without a token; add auth or list them in PUBLIC"


def test_public_routes_exist_and_answer_without_a_token(secured: TestClient) -> None:
    routes = set(openapi_routes(secured))
    assert routes >= PUBLIC, PUBLIC - routes
    for _, path in sorted(PUBLIC):
        assert secured.get(path).status_code == 200, path
    for path in DOCS:
        assert secured.get(path).status_code == 200, path


ORIGIN = "https://lab.example.org"


def preflight(client: TestClient, origin: str) -> dict[str, str]:
    response = client.options(
        "/api/v1/projects",
        headers={"Origin": origin, "Access-Control-Request-Method": "GET"},
    )
    return {k.lower(): v for k, v in response.headers.items()}


def test_cors_is_off_by_default(secured: TestClient, tokens: dict[str, str]) -> None:
    response = secured.get(
        "/api/v1/projects", headers={"Origin": ORIGIN, **bearer(tokens["admin"])}
    )
    assert response.status_code == 200
    assert "access-control-allow-origin" not in {k.lower() for k in response.headers}
    assert "access-control-allow-origin" not in preflight(secured, ORIGIN)


def test_cors_allows_only_the_configured_origins(
    settings: Settings, stores: Stores, tokens: dict[str, str]
) -> None:
    configured = settings.model_copy(update={"cors_origins": [ORIGIN]})
    with TestClient(full_app(configured, stores)) as client:
        allowed = client.get(
            "/api/v1/projects", headers={"Origin": ORIGIN, **bearer(tokens["admin"])}
        )
        assert allowed.headers.get("access-control-allow-origin") == ORIGIN
        assert preflight(client, ORIGIN).get("access-control-allow-origin") == ORIGIN

        other = "https://evil.example.com"
        refused = client.get(
            "/api/v1/projects", headers={"Origin": other, **bearer(tokens["admin"])}
        )
        assert "access-control-allow-origin" not in {k.lower() for k in refused.headers}
        assert "access-control-allow-origin" not in preflight(client, other)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_request_body_over_the_limit_is_413(
    settings: Settings, stores: Stores, tokens: dict[str, str], framing: str
) -> None:
    limited = settings.model_copy(update={"max_request_bytes": 1024})
    body = b'{"name": "' + b"x" * 4096 + b'"}'
    with TestClient(full_app(limited, stores)) as client:
        headers = {"Content-Type": "application/json", **bearer(tokens["admin"])}
        content = body if framing == "content-length" else iter([body[:1000], body[1000:]])
        response = client.post("/api/v1/projects", content=content, headers=headers)
        assert response.status_code == 413
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json()["status"] == 413
        # Under the limit, the same route reads the body (and answers with something else).
        small = client.post("/api/v1/projects", json={"name": "x"}, headers=headers)
        assert small.status_code != 413


SHELL = re.compile(r"shell\s*=\s*True|os\.system\s*\(")


def test_no_shell_in_the_service() -> None:
    files = [p for top in ("app", "workers") for p in (ROOT / top).rglob("*.py")]
    assert len(files) > 10, f"found only {len(files)} source files under {ROOT}"
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if SHELL.search(line)
    ]
    assert offenders == []


def test_ruff_enforces_the_bandit_shell_rules() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    lint = config["tool"]["ruff"]["lint"]
    selected, ignored = lint["select"], lint.get("ignore", [])
    assert "S" in selected or {"S602", "S605"} <= set(selected)
    assert not {"S", "S602", "S605"} & set(ignored)
    for pattern, rules in lint.get("per-file-ignores", {}).items():
        if pattern.startswith(("app", "workers")):
            assert not {"S", "S602", "S605"} & set(rules), pattern


def test_the_small_default_limit_spares_the_routes_that_need_more(
    client: TestClient, tokens: dict[str, str], settings: Settings
) -> None:
    """Issue 20, item 6: 1 MiB by default; a memory import takes its 50 MB file."""
    assert settings.max_request_bytes == 1024 * 1024
    over = b"{" + b" " * (2 * 1024 * 1024) + b"}"
    cycles = client.post(
        "/api/v1/cycles",
        content=over,
        headers={**bearer(tokens["trigger"]), "Content-Type": "application/json"},
    )
    assert cycles.status_code == 413 and cycles.json()["type"].endswith("too-large")
    lines = b'{"kind": "lesson", "statement": "a lesson of two MiB"}\n' + b"\n" * (2 << 20)
    imported = client.post(
        "/api/v1/memory/import",
        files={"file": ("lessons.jsonl", lines)},
        data={"format": "jsonl"},
        headers=bearer(tokens["admin"]),
    )
    assert imported.status_code == 200, imported.text
    assert imported.json()["imported"] == 1
