"""Idempotency-Key on POST /api/v1/cycles (issue 20, item 2): any key the header allows fits,
a reuse with another body is a 422 that says so, keys of two callers never meet, and a key is
remembered for AUTOPILOT_IDEMPOTENCY_TTL_S only."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from app.clock import utcnow
from app.cycles.models import Cycle
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.support import bearer

# Both stacks: a reused key meets the unique constraint of each dialect.
pytestmark = pytest.mark.stores("sqlite", "postgres")


def project(stores: Stores) -> None:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="idem", repo_url="/srv/git/idem.git"))


def count(stores: Stores) -> int:
    with stores.ops_session() as session:
        return session.query(Cycle).count()


def test_a_long_key_is_stored_and_a_reuse_returns_the_first_cycle(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    project(stores)
    headers = {**bearer(tokens["trigger"]), "Idempotency-Key": "k" * 128}
    first = client.post("/api/v1/cycles", json={"project": "idem"}, headers=headers)
    assert first.status_code == 201, first.text
    again = client.post("/api/v1/cycles", json={"project": "idem"}, headers=headers)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    too_long = {**bearer(tokens["trigger"]), "Idempotency-Key": "k" * 129}
    refused = client.post("/api/v1/cycles", json={"project": "idem"}, headers=too_long)
    assert refused.status_code == 422
    assert count(stores) == 1


def test_a_key_reused_with_another_body_is_refused_and_nothing_is_made(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    project(stores)
    headers = {**bearer(tokens["trigger"]), "Idempotency-Key": "nightly-1"}
    first = client.post("/api/v1/cycles", json={"project": "idem"}, headers=headers)
    assert first.status_code == 201
    other = client.post(
        "/api/v1/cycles",
        json={"project": "idem", "changed_hypothesis": "something else"},
        headers=headers,
    )
    assert other.status_code == 422, other.text
    problem = other.json()
    assert problem["type"].endswith("idempotency-key-reused")
    assert f"cycle {first.json()['id']}" in problem["detail"]
    assert count(stores) == 1


def test_two_callers_keys_never_meet_and_an_old_key_is_free_again(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    project(stores)
    body = {"project": "idem"}
    mine = client.post(
        "/api/v1/cycles", json=body, headers={**bearer(tokens["trigger"]), "Idempotency-Key": "x"}
    )
    theirs = client.post(
        "/api/v1/cycles", json=body, headers={**bearer(tokens["admin"]), "Idempotency-Key": "x"}
    )
    assert mine.status_code == theirs.status_code == 201
    assert mine.json()["id"] != theirs.json()["id"]
    with stores.ops_session() as session:  # a day and a minute later
        row = session.get(Cycle, mine.json()["id"])
        assert row is not None
        row.created_at = utcnow() - timedelta(days=1, minutes=1)
    later = client.post(
        "/api/v1/cycles", json=body, headers={**bearer(tokens["trigger"]), "Idempotency-Key": "x"}
    )
    assert later.status_code == 201 and later.json()["id"] not in (
        mine.json()["id"],
        theirs.json()["id"],
    )
