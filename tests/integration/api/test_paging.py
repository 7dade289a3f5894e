"""Lists a page at a time (issue 20, item 12): limit and offset, `X-Total-Count` and a
`Link: rel="next"` header; an unknown filter value is a 422, not an empty list; operation ids
that read well in a generated client."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.support import bearer


def test_cycles_come_a_page_at_a_time_with_their_total(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="paged", repo_url="/srv/git/paged.git"))
    trigger, reader = bearer(tokens["trigger"]), bearer(tokens["review"])
    made = [
        client.post("/api/v1/cycles", json={"project": "paged"}, headers=trigger).json()["id"]
        for _ in range(5)
    ]
    first = client.get("/api/v1/cycles", params={"limit": 2}, headers=reader)
    assert first.status_code == 200
    assert [c["id"] for c in first.json()] == made[::-1][:2]  # newest first
    assert first.headers["X-Total-Count"] == "5"
    assert 'rel="next"' in first.headers["Link"] and "offset=2" in first.headers["Link"]
    following = first.headers["Link"].split(">")[0].lstrip("<")
    second = client.get(following, headers=reader)
    assert [c["id"] for c in second.json()] == made[::-1][2:4]
    last = client.get("/api/v1/cycles", params={"limit": 2, "offset": 4}, headers=reader)
    assert [c["id"] for c in last.json()] == [made[0]] and "Link" not in last.headers
    planned = client.get("/api/v1/cycles", params={"state": "planned"}, headers=reader)
    assert planned.headers["X-Total-Count"] == "5"
    bogus = client.get("/api/v1/cycles", params={"state": "bogus"}, headers=reader)
    assert bogus.status_code == 422 and "state" in bogus.text
    assert client.get("/api/v1/cycles", params={"limit": 0}, headers=reader).status_code == 422


def test_jobs_carry_the_same_paging_headers(client: TestClient, tokens: dict[str, str]) -> None:
    reader = bearer(tokens["review"])
    empty = client.get("/api/v1/jobs", headers=reader)
    assert empty.json() == [] and empty.headers["X-Total-Count"] == "0"
    assert "Link" not in empty.headers
    assert client.get("/api/v1/jobs", params={"state": "bogus"}, headers=reader).status_code == 422


def test_operation_ids_read_well(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"listCycles", "triggerCycle", "getCycle", "listJobs", "exportFindings"} <= set(ids)
    assert not [i for i in ids if "_" in i]
