"""A code change is part of the hypothesis: a command agent that makes a different change at a
judged point is not stopped by the repeat check, the same change at the same point is."""

from __future__ import annotations

import sys
from pathlib import Path

import git
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.memory import service as memory
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import bearer, wait_for

# The agent's change depends on how many cycles it has seen: A, then B, then A again. Every
# cycle is at the same point (probe at sleep_s 0.05), so only the change tells them apart.
AGENT = """
import json, os, pathlib
context = json.load(open(os.environ["AUTOPILOT_CONTEXT"]))
variant = ["A", "B", "A"][len(context["recent_cycles"])]
pathlib.Path("probe/tuning.py").write_text(f"VARIANT = {variant!r}\\n")
json.dump({"hypothesis": f"tuning variant {variant} keeps the probe's time",
           "experiment": "probe", "parameters": {"sleep_s": 0.05},
           "what_changed": f"probe/tuning.py: variant {variant}"},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""

ENDS = ("awaiting_review", "failed", "skipped_repeat")


def agent_repo(root: Path) -> Path:
    repo_dir = make_repo(root, "changes")
    config = repo_dir / "autopilot.toml"
    config.write_text(
        config.read_text()
        + f'\n[agent]\nkind = "command"\ncommand = ["{sys.executable}", "agent.py"]\n'
        "time_limit_s = 60\n"
    )
    (repo_dir / "agent.py").write_text(AGENT)
    repo = git.Repo(repo_dir)
    repo.index.add(["autopilot.toml", "agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("command agent", author=actor, committer=actor)
    return repo_dir


def test_a_different_change_is_a_new_hypothesis_and_the_same_change_a_repeat(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = agent_repo(tmp_path)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger", "review"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")

    with TestClient(create_app(workers.settings, stores)) as client:

        def cycle() -> dict:  # type: ignore[type-arg]
            made = client.post("/api/v1/cycles", json={"project": repo.name}, headers=bearer(token))
            assert made.status_code in (200, 201, 202), made.text
            cycle_id = made.json()["id"]

            def ended() -> dict | None:  # type: ignore[type-arg]
                body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
                return body if body["state"] in ENDS else None

            return wait_for(ended, timeout=180)

        def review(cycle_id: int) -> None:
            decided = client.post(
                f"/api/v1/cycles/{cycle_id}/review",
                headers=bearer(token),
                json={"decision": "reject", "note": "no gain"},
            )
            assert decided.status_code == 200, decided.text

        first = cycle()
        assert first["state"] == "awaiting_review", (first, workers.logs())
        review(first["id"])

        # Same point, another change: before changes were part of the fingerprint, this ended
        # skipped_repeat ("already judged") and a coding agent was stopped after one review.
        second = cycle()
        assert second["state"] == "awaiting_review", (second, workers.logs())
        assert second["parameters"] == first["parameters"]
        assert second["fingerprint"] != first["fingerprint"]
        review(second["id"])

        # The first change again at the same point on the same base: a repeat of a judged test.
        third = cycle()
        assert third["state"] == "skipped_repeat", (third, workers.logs())
        assert third["fingerprint"] == first["fingerprint"]
        assert "already judged" in (third["error"] or "")

    # Memory holds both judged changes, each under its own fingerprint.
    with stores.memory_session() as session:
        refuted = {
            memory.get(session, fid).fingerprint
            for c in (first, second)
            for fid in c["finding_ids"]
        }
    assert refuted == {first["fingerprint"], second["fingerprint"]}, [
        (c["id"], c["fingerprint"], c["finding_ids"]) for c in (first, second)
    ]
