"""A stopped campaign: no step starts after the stop, the live ones are cancelled, and it still
ends with its pull request of what was kept, measured against its start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.campaigns.test_campaign_line import campaign_repo, follow
from tests.integration.queue.conftest import Workers
from tests.reliability.test_campaign_kill import AGENT
from tests.support import bearer, wait_for

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing


def test_a_stopped_campaign_ends_with_its_pull_request(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: the line's logic does not depend on the stores")
    repo = campaign_repo(tmp_path, "stopped")
    (repo / "agent.py").write_text(AGENT)  # every step a real speed-up
    checkout = git.Repo(repo)
    checkout.index.add(["agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    checkout.index.commit("agent: always faster", author=actor, committer=actor)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")

    with TestClient(create_app(workers.settings, stores)) as client:
        made = client.post(
            "/api/v1/campaigns",
            json={"project": repo.name, "max_cycles": 50},
            headers=bearer(token),
        )
        campaign_id = made.json()["id"]

        def one_kept() -> dict[str, Any] | None:
            body: dict[str, Any] = client.get(
                f"/api/v1/campaigns/{campaign_id}", headers=bearer(token)
            ).json()
            return body if body["kept"] >= 1 else None

        wait_for(one_kept, timeout=300)
        stopped = client.post(f"/api/v1/campaigns/{campaign_id}/stop", headers=bearer(token))
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["stop_requested"] is True
        ended = follow(client, token, campaign_id, timeout=300)
        # Stopping again is refused: it has ended.
        again = client.post(f"/api/v1/campaigns/{campaign_id}/stop", headers=bearer(token))
        assert again.status_code == 409, again.text

    assert ended["state"] == "stopped", (ended, workers.logs()[-4000:])
    assert ended["end_reason"].startswith("stopped by ci"), ended["end_reason"]
    steps = ended["steps"]
    assert len(steps) < 50
    kept = [s for s in steps if s["outcome"] == "kept"]
    assert kept, steps
    # Whatever was in flight when it stopped is discarded with why; nothing is left pending.
    for step in steps:
        assert step["outcome"] in ("kept", "discarded"), step
        if step["outcome"] == "discarded":
            assert step["reason"] in ("cancelled", "stopped"), step
    assert ended["cumulative"]["ci_high"] < 1.0, ended["cumulative"]
    ref = ProjectRef(repo.name, str(repo), "main")
    prs = LocalForge(workers.settings, stores).list_pull_requests(ref)
    assert [p.number for p in prs] == [ended["pr_number"]]
