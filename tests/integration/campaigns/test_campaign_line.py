"""A campaign over a small repository, end to end: a scripted command agent whose changes are,
in turn, a real speed-up, a real slow-down, a no-op, a change that only prints a better number,
and a second real speed-up. The line keeps exactly the two speed-ups, each confirmed on fresh
blocks; the final PR lists them with a cumulative ratio whose interval is below 1; each
discarded step says why (docs/design.md, "Research lines")."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.memory import service as memory
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers
from tests.support import bearer, wait_for

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

# The runner's clock: what the candidate prints is never read.
[experiments.work]
kind = "command"
command = ["python", "work.py"]
metric = "run_s"
metric_source = "wall"
direction = "lower"
repeats = 8
stopping = "sequential"
time_limit_s = 30
"""

WORK = """
import time
import speed

time.sleep(speed.DELAY)
"""

# The agent's change depends on how many steps the line shows it (newest first).
AGENT = """
import json, os, pathlib, re
context = json.load(open(os.environ["AUTOPILOT_CONTEXT"]))
step = len(context["line"] or [])
speed = pathlib.Path("speed.py")
delay = float(re.search(r"DELAY = ([0-9.]+)", speed.read_text()).group(1))
if step in (0, 4):
    speed.write_text(f"DELAY = {delay * 0.6:.4f}\\n")
    hypothesis = f"sleeping {delay * 0.6:.4f} s instead of {delay:.4f} s is faster"
elif step == 1:
    speed.write_text(f"DELAY = {delay * 1.6:.4f}\\n")
    hypothesis = f"sleeping {delay * 1.6:.4f} s is faster (it is not)"
elif step == 2:
    speed.write_text(speed.read_text() + "# tuned\\n")
    hypothesis = "a comment makes it faster (it changes nothing)"
else:
    work = pathlib.Path("work.py")
    work.write_text(work.read_text() + "print('run_s 0.000001')\\n")
    hypothesis = "printing a tiny run_s makes it faster (only the printed number is)"
json.dump({"hypothesis": hypothesis, "experiment": "work", "parameters": {},
           "what_changed": f"step {step}"}, open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


def campaign_repo(root: Path, name: str) -> Path:
    repo_dir = root / name
    repo_dir.mkdir(parents=True)
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name, python=sys.executable))
    (repo_dir / "work.py").write_text(textwrap.dedent(WORK))
    (repo_dir / "speed.py").write_text("DELAY = 0.5000\n")  # well clear of start-up noise
    (repo_dir / "agent.py").write_text(AGENT)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["autopilot.toml", "work.py", "speed.py", "agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("a timed sleep", author=actor, committer=actor)
    return repo_dir


ENDS = ("finished", "stopped", "failed")


def follow(client: TestClient, token: str, campaign_id: int, timeout: float) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        body = client.get(f"/api/v1/campaigns/{campaign_id}", headers=bearer(token)).json()
        return body if body["state"] in ENDS else None

    found: dict[str, Any] = wait_for(ended, timeout=timeout)
    return found


def test_a_campaign_keeps_exactly_the_confirmed_speed_ups(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: the line's logic does not depend on the stores")
    repo = campaign_repo(tmp_path, "line")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger", "review"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")

    with TestClient(create_app(workers.settings, stores)) as client:
        made = client.post(
            "/api/v1/campaigns",
            json={"project": repo.name, "max_cycles": 5},
            headers=bearer(token),
        )
        assert made.status_code == 202, made.text
        campaign = follow(client, token, made.json()["id"], timeout=600)
        # The reviewer approves the line: each kept step's finding and the cumulative one.
        decided = client.post(
            f"/api/v1/campaigns/{campaign['id']}/review",
            json={"decision": "approve", "note": "two real speed-ups"},
            headers=bearer(token),
        )
        assert decided.status_code == 200, decided.text
        again = client.post(
            f"/api/v1/campaigns/{campaign['id']}/review",
            json={"decision": "reject", "note": "changed my mind"},
            headers=bearer(token),
        )
        assert again.status_code == 409, again.text

    assert campaign["state"] == "finished", (campaign, workers.logs())
    steps = campaign["steps"]
    assert [s["outcome"] for s in steps] == [
        "kept",
        "discarded",
        "discarded",
        "discarded",
        "kept",
    ], (steps, workers.logs())
    # Each discarded step says why, in the keep rule's words.
    assert steps[1]["reason"] == "loss", steps[1]
    assert steps[2]["reason"] == "null", steps[2]
    assert steps[3]["reason"] == "null", steps[3]
    for step in steps:
        assert step["sentence"], step
        assert step["ratio"] is not None, step
    # Each kept step was confirmed on its own cycle, at the tip it started from, and the line
    # moved only to kept commits: each step starts at the one kept before it.
    kept = [s for s in steps if s["outcome"] == "kept"]
    assert all(s["confirmation_cycle_id"] for s in kept)
    assert steps[0]["tip_sha"] == campaign["start_sha"]
    assert [s["tip_sha"] for s in steps[1:]] == [kept[0]["kept_sha"]] * 4
    assert campaign["tip_sha"] == kept[1]["kept_sha"]
    # The line on the forge holds the two kept commits over the start, and nothing else.
    ref = ProjectRef(repo.name, str(repo), "main")
    forge = LocalForge(workers.settings, stores)
    bare = git.Repo(forge.bare_path(ref))
    line = [
        c.hexsha for c in bare.iter_commits(f"{campaign['start_sha']}..{campaign['line_branch']}")
    ]
    assert line == [kept[1]["kept_sha"], kept[0]["kept_sha"]], line
    # The cumulative result: the tip against the start, on fresh runs, an interval below 1.
    cumulative = campaign["cumulative"]
    assert cumulative["verdict"] == "faster", cumulative
    assert cumulative["ci_high"] < 1.0, cumulative
    assert cumulative["ratio"] < kept[0]["ratio"], (cumulative, kept)
    # One PR, from the line to the default branch, that stands alone: the kept steps (commit,
    # hypothesis, ratio and interval), the cumulative result, what was discarded and why.
    pr = forge.get_pull_request(ref, campaign["pr_number"])
    assert (pr.head, pr.base) == (campaign["line_branch"], "main"), pr
    assert len(forge.list_pull_requests(ref)) == 1
    for step in kept:
        assert step["kept_sha"][:12] in pr.body, pr.body
        assert f"{step['ratio']:.4f} [{step['ci_low']:.4f}, {step['ci_high']:.4f}]" in pr.body
    assert f"ratio {cumulative['ratio']:.4f} [{cumulative['ci_low']:.4f}," in pr.body, pr.body
    for step in steps:
        if step["outcome"] == "discarded":
            assert f"| cycle {step['cycle_id']} |" in pr.body and step["reason"] in pr.body
    # Approving validated exactly the campaign's findings: one per kept step, one cumulative.
    assert decided.json()["decision"] == "approved"
    with stores.memory_session() as session:
        findings = [memory.get(session, fid) for fid in campaign["finding_ids"]]
    assert len(findings) == 3, findings
    assert {f.status for f in findings} == {"validated"}
    for step, finding in zip(kept, findings, strict=False):
        assert step["kept_sha"][:12] in finding.statement, finding.statement
    assert findings[-1].statement.startswith(f"Campaign {campaign['id']}: 2 kept step(s)")
