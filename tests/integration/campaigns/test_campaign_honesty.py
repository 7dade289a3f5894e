"""What a campaign's line keeps is code: an agent that asks for a faster parameter with a change
that does nothing gains nothing (the step runs at the experiment's defaults on both arms), a
step that changes no file is discarded `no_change` before any GPU is asked, and a campaign
asked for what its project cannot give fails at once, saying what to change."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.campaigns.test_campaign_line import follow
from tests.integration.queue.conftest import Workers
from tests.support import bearer

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
python_requirements = []

[agent]
kind = "command"
command = ["{python}", "agent.py"]
time_limit_s = 60

[experiments.work]
kind = "command"
command = ["python", "work.py", "{{delay}}"]
metric = "run_s"
metric_source = "wall"
direction = "lower"
repeats = 8
stopping = "sequential"
time_limit_s = 30
parameters = {{ delay = [0.3, 0.05] }}
defaults = {{ delay = 0.3 }}
"""
WORK = "import sys, time\ntime.sleep(float(sys.argv[1]))\n"
# Step 0: a comment, and the parameter six times faster; step 1: an empty commit.
AGENT = """
import json, os, pathlib, subprocess
context = json.load(open(os.environ["AUTOPILOT_CONTEXT"]))
step = len(context["line"] or [])
if step == 0:
    work = pathlib.Path("work.py")
    work.write_text(work.read_text() + "# tuned\\n")
    hypothesis = "a comment, at delay=0.05"
else:
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@example.invalid",
                    "commit", "--allow-empty", "-q", "-m", "nothing"], check=True)
    hypothesis = "an empty commit, at delay=0.05"
json.dump({"hypothesis": hypothesis, "experiment": "work", "parameters": {"delay": 0.05},
           "what_changed": f"step {step}"}, open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


def trick_repo(root: Path, name: str) -> Path:
    repo_dir = root / name
    repo_dir.mkdir()
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name, python=sys.executable))
    (repo_dir / "work.py").write_text(WORK)
    (repo_dir / "agent.py").write_text(AGENT)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["autopilot.toml", "work.py", "agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("a timed sleep", author=actor, committer=actor)
    return repo_dir


def start(client: TestClient, token: str, **body: Any) -> dict[str, Any]:
    made = client.post("/api/v1/campaigns", json=body, headers=bearer(token))
    assert made.status_code == 202, made.text
    return follow(client, token, made.json()["id"], timeout=600)


def test_a_parameter_or_an_empty_commit_is_never_kept(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: the line's logic does not depend on the stores")
    repo = trick_repo(tmp_path, "trick")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(workers.settings, stores)) as client:
        ended = start(client, token, project=repo.name, max_cycles=2)

    assert ended["state"] == "finished", (ended, workers.logs()[-4000:])
    assert ended["kept"] == 0 and ended["pr_url"] is None, ended
    comment, empty = ended["steps"]
    # The comment ran at the defaults on both arms: no change, whatever the agent asked for.
    assert comment["outcome"] == "discarded" and comment["reason"] == "null", comment
    assert abs(comment["ratio"] - 1.0) < 0.2, comment
    # The empty commit never reached a GPU.
    assert empty["outcome"] == "discarded" and empty["reason"] == "no_change", empty
    assert "no code change" in empty["sentence"], empty
    with stores.ops_session() as session:
        ran = {j.cycle_id: dict(j.spec or {}) for j in session.query(Job).all()}
    assert set(ran) == {comment["cycle_id"]}
    assert ran[comment["cycle_id"]]["parameters"] == {"delay": 0.3}
    assert ended["end_reason"].startswith("max_cycles reached")


def test_a_campaign_asked_for_what_its_project_cannot_give_fails_at_once(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end")
    repo = trick_repo(tmp_path, "asks")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    with TestClient(create_app(workers.settings, stores)) as client:
        unknown = start(client, token, project=repo.name, experiment="nope")
        sweep = start(client, token, project=repo.name, agent="sweep")
    assert unknown["state"] == "failed" and "nope" in unknown["error"], unknown
    assert unknown["steps"] == []
    assert sweep["state"] == "failed" and "sweep agent changes none" in sweep["error"], sweep
    assert sweep["steps"] == []
