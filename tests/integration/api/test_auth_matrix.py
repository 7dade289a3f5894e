"""Every route under /api/v1 refuses no token, a wrong token, a revoked token and a wrong scope.

The routes are read from the OpenAPI document, so a new route is covered the day it is added.
"""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from tests.support import bearer

# The scope each route needs; None: any valid token. A route missing here fails the test.
SCOPE_RULES: dict[tuple[str, str], str | None] = {
    ("post", "/api/v1/projects"): "admin",
    ("get", "/api/v1/projects"): None,
    ("get", "/api/v1/projects/{name}"): None,
    ("delete", "/api/v1/projects/{name}"): "admin",
    ("get", "/api/v1/memory/findings"): None,
    ("post", "/api/v1/memory/findings"): "trigger",
    ("get", "/api/v1/memory/findings/{finding_id}"): None,
    ("post", "/api/v1/memory/findings/{finding_id}/validate"): "review",
    ("post", "/api/v1/memory/findings/{finding_id}/refute"): "review",
    ("post", "/api/v1/memory/findings/{finding_id}/supersede"): "review",
    ("post", "/api/v1/memory/import"): "admin",
    ("get", "/api/v1/memory/export"): "review",  # the whole store, unreviewed included
    ("post", "/api/v1/jobs"): "trigger",
    ("get", "/api/v1/jobs"): None,
    ("get", "/api/v1/jobs/{job_id}"): None,
    ("post", "/api/v1/jobs/{job_id}/cancel"): "trigger",
    ("get", "/api/v1/jobs/{job_id}/log"): None,
    ("put", "/api/v1/jobs/{job_id}/log"): "worker",  # a GPU host hands in a job's whole log
    ("get", "/api/v1/workers"): None,
    ("get", "/api/v1/queues"): None,
    ("post", "/api/v1/cycles"): "trigger",
    ("post", "/api/v1/campaigns"): "trigger",
    ("get", "/api/v1/campaigns"): None,
    ("get", "/api/v1/campaigns/{campaign_id}"): None,
    ("post", "/api/v1/campaigns/{campaign_id}/stop"): "trigger",
    ("post", "/api/v1/campaigns/{campaign_id}/review"): "review",
    ("get", "/api/v1/cycles"): None,
    ("get", "/api/v1/cycles/{cycle_id}"): None,
    ("post", "/api/v1/cycles/{cycle_id}/cancel"): "trigger",
    ("post", "/api/v1/cycles/{cycle_id}/review"): "review",
    ("post", "/api/v1/projects/{name}/autopilot"): "trigger",
    ("get", "/api/v1/projects/{name}/plot"): None,
}

# Authenticated by a signature of each request, not a token (test_security.py checks them).
SIGNED = {("post", "/api/v1/webhooks/github")}


def api_routes(client: TestClient) -> list[tuple[str, str]]:
    spec = client.get("/openapi.json").json()
    return [
        (method, path)
        for path, item in spec["paths"].items()
        if path.startswith("/api/v1")
        for method in item
        if (method, path) not in SIGNED
    ]


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x", path)


def test_every_route_has_a_scope_rule(client: TestClient) -> None:
    routes = api_routes(client)
    assert routes, "no /api/v1 routes in the OpenAPI document"
    assert sorted(routes) == sorted(SCOPE_RULES)


@pytest.mark.parametrize("presented", ["none", "garbage", "revoked"])
def test_unauthenticated_is_401(client: TestClient, tokens: dict[str, str], presented: str) -> None:
    headers = {
        "none": {},
        "garbage": bearer("ap_not-a-token"),
        "revoked": bearer(tokens["revoked"]),
    }
    for method, path in api_routes(client):
        response = client.request(method, concrete(path), headers=headers[presented], json={})
        assert response.status_code == 401, (method, path, presented)
        assert response.headers["content-type"] == "application/problem+json"
        assert response.headers["www-authenticate"] == "Bearer"


def test_wrong_scope_is_403(client: TestClient, tokens: dict[str, str]) -> None:
    for (method, path), scope in SCOPE_RULES.items():
        if scope is None:
            continue
        wrong = next(s for s in ("trigger", "review") if s != scope)
        response = client.request(method, concrete(path), headers=bearer(tokens[wrong]), json={})
        assert response.status_code == 403, (method, path)
        assert scope in response.json()["detail"]


def test_worker_token_is_403_on_every_route(client: TestClient, tokens: dict[str, str]) -> None:
    """A GPU host's token fetches from the forge over HTTP, hands in job logs, and reads nothing
    of the API."""
    for method, path in api_routes(client):
        if SCOPE_RULES.get((method, path)) == "worker":
            continue
        response = client.request(method, concrete(path), headers=bearer(tokens["worker"]), json={})
        assert response.status_code == 403, (method, path)
        assert response.headers["content-type"] == "application/problem+json"
