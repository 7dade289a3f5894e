"""The trigger route's shortcuts (issue 18): a verified token is trusted for a few seconds, and
new cycles' doorbells go out together, every cycle's id in exactly one of them."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app import broker
from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import bearer


@pytest.fixture
def project(stores: Stores, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "repos", "trig")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="trig", repo_url=str(repo)))
    return "trig"


@pytest.fixture
def token(stores: Stores) -> str:
    with stores.ops_session() as session:
        return ops.create_token(session, "trig-admin", ["admin"])[1]


def serve(settings: Settings, stores: Stores, **changes: object) -> TestClient:
    return TestClient(create_app(settings.model_copy(update=changes), stores))


def revoke_elsewhere(stores: Stores, name: str) -> None:
    """What `autopilot token revoke` in another process does: this process's cache is not told."""
    with stores.ops_session() as session:
        row = next(t for t in ops.list_tokens(session) if t.name == name)
        row.revoked_at = row.created_at


def clock(monkeypatch: pytest.MonkeyPatch, start: float) -> list[float]:
    now = [start]
    monkeypatch.setattr(ops.time, "monotonic", lambda: now[0])
    return now


def test_a_revocation_here_is_honoured_at_once(
    settings: Settings, stores: Stores, token: str
) -> None:
    with serve(settings, stores) as client:
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 200
        with stores.ops_session() as session:
            ops.revoke_token(session, "trig-admin")
        answer = client.get("/api/v1/projects", headers=bearer(token))
        assert answer.status_code == 401
        assert "revoked" in answer.json()["detail"]


def test_a_revocation_elsewhere_is_honoured_within_the_cache_ttl(
    settings: Settings, stores: Stores, token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = clock(monkeypatch, 1000.0)
    with serve(settings, stores, token_cache_s=5.0) as client:
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 200
        revoke_elsewhere(stores, "trig-admin")
        now[0] += 4.9  # still within the TTL: the cached check stands
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 200
        now[0] += 0.2  # past it: the DB is asked again
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 401


def test_no_cache_asks_the_db_every_time(settings: Settings, stores: Stores, token: str) -> None:
    with serve(settings, stores, token_cache_s=0) as client:
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 200
        revoke_elsewhere(stores, "trig-admin")
        assert client.get("/api/v1/projects", headers=bearer(token)).status_code == 401


def rung_cycles(settings: Settings) -> list[list[int]]:
    """The cycle ids of each advance doorbell waiting in the filesystem broker's control queue."""
    rung = []
    for path in sorted((settings.broker_dir / "queue").glob("*.control.msg")):
        message = json.loads(path.read_text())
        args = json.loads(base64.b64decode(message["body"]))[0]
        task = message["headers"]["task"]
        assert task in (broker.ADVANCE_CYCLE, broker.ADVANCE_CYCLES)
        rung.append(args[0] if task == broker.ADVANCE_CYCLES else args)
    return rung


def test_every_new_cycle_is_rung_once_and_a_replay_not_at_all(
    settings: Settings, stores: Stores, project: str, token: str
) -> None:
    made = []
    with serve(settings, stores) as client:
        for n in range(12):
            answer = client.post(
                "/api/v1/cycles",
                json={"project": project},
                headers={**bearer(token), "Idempotency-Key": f"k{n % 10}"},
            )
            assert answer.status_code == (201 if n < 10 else 200)
            assert answer.json()["job_id"] is None and answer.json()["state"] == "planned"
            made.append(answer.json()["id"])
    # Leaving the client ran the app's shutdown, which sends what the coalescer still held.
    rung = rung_cycles(settings)
    assert sorted(i for ids in rung for i in ids) == sorted(set(made))
    assert len(set(made)) == 10


def test_the_live_cycle_cap_still_refuses_with_nothing_stored(
    settings: Settings, stores: Stores, project: str, token: str
) -> None:
    with serve(settings, stores, max_live_cycles_per_project=2) as client:
        codes = [
            client.post("/api/v1/cycles", json={"project": project}, headers=bearer(token))
            for _ in range(3)
        ]
        assert [c.status_code for c in codes] == [201, 201, 429]
        assert codes[2].json()["type"].endswith("/too-many-cycles")
        assert "2 unfinished cycles (limit 2" in codes[2].json()["detail"]
        listed = client.get(f"/api/v1/cycles?project={project}", headers=bearer(token))
        assert listed.headers["X-Total-Count"] == "2"
        missing = client.post("/api/v1/cycles", json={"project": "nope"}, headers=bearer(token))
        assert missing.status_code == 404
        assert "no project named 'nope'" in missing.json()["detail"]


def test_the_control_worker_fans_a_burst_doorbell_out_to_each_cycle(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import tasks

    monkeypatch.setattr(tasks, "get_settings", lambda: settings)
    broker.ring_advance_many(settings, [3, 4, 5])
    assert rung_cycles(settings) == [[3, 4, 5]]
    for path in (settings.broker_dir / "queue").glob("*.control.msg"):
        path.unlink()  # consumed
    assert tasks.advance_cycles.run([3, 4, 5]) == [3, 4, 5]
    assert sorted(rung_cycles(settings)) == [[3], [4], [5]]  # each cycle's own doorbell
