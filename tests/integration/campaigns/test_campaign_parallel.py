"""A campaign with `parallel = 4` on four CPU "GPU" workers: each round runs four steps at once
from the same tip, the confirmed best advances the line and the other confirmed ones are

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing
superseded, and the line never moves to a commit that was not confirmed on the tip it started
from (docs/design.md, "Research lines")."""

from __future__ import annotations

from pathlib import Path

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
from tests.support import bearer

# Four steps of a round are four consecutive cycles: each takes its variant from its cycle id,
# so every round holds a large and a small speed-up, a slow-down and a no-op.
AGENT = """
import json, os, pathlib, re
context = json.load(open(os.environ["AUTOPILOT_CONTEXT"]))
variant = context["cycle_id"] % 4
speed = pathlib.Path("speed.py")
delay = float(re.search(r"DELAY = ([0-9.]+)", speed.read_text()).group(1))
factor = {0: 0.5, 1: 0.65, 2: 1.5, 3: 1.0}[variant]
speed.write_text(f"DELAY = {delay * factor:.4f}\\n" + ("# same\\n" if factor == 1.0 else ""))
json.dump({"hypothesis": f"variant {variant}: sleeping x{factor} (beside "
                         f"{len(context['parallel_hypotheses'])} others)",
           "experiment": "work", "parameters": {}, "what_changed": f"x{factor}"},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


def test_four_steps_at_once_keep_only_the_confirmed_best_of_each_tip(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend
) -> None:
    if backend.name != "sqlite":
        pytest.skip("one back end: the line's logic does not depend on the stores")
    repo = campaign_repo(tmp_path, "wide")
    (repo / "agent.py").write_text(AGENT)
    # Long enough that even the second round's smaller speed-up stands well clear of the noise
    # of starting a process on a loaded machine.
    (repo / "speed.py").write_text("DELAY = 0.8000\n")
    checkout = git.Repo(repo)
    checkout.index.add(["agent.py", "speed.py"])
    actor = git.Actor("t", "t@example.invalid")
    checkout.index.commit("agent: four variants", author=actor, committer=actor)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    for device in range(4):
        workers.start(f"gpu{device}", "gpu", "--kind", "cpu", "--device", str(device))

    with TestClient(create_app(workers.settings, stores)) as client:
        made = client.post(
            "/api/v1/campaigns",
            json={"project": repo.name, "max_cycles": 8, "parallel": 4},
            headers=bearer(token),
        )
        assert made.status_code == 202, made.text
        campaign = follow(client, token, made.json()["id"], timeout=900)

    assert campaign["state"] == "finished", (campaign, workers.logs()[-6000:])
    steps = campaign["steps"]
    assert [s["round"] for s in steps] == [1] * 4 + [2] * 4, steps
    kept = [s for s in steps if s["outcome"] == "kept"]
    # One keep per round, in order: the first round's from the start, the second's from it.
    assert [s["round"] for s in kept] == [1, 2], steps
    assert kept[0]["tip_sha"] == campaign["start_sha"]
    assert kept[1]["tip_sha"] == kept[0]["kept_sha"]
    assert all(s["tip_sha"] == kept[0]["kept_sha"] for s in steps if s["round"] == 2)
    # The kept steps are each round's largest speed-up; the smaller one, confirmed too, is
    # superseded; the slow-down is a loss and the no-op is no change.
    by_variant = {}
    for s in steps:
        by_variant.setdefault(s["hypothesis"].split(":")[0], []).append(s)
    assert {s["cycle_id"] for s in by_variant["variant 0"]} == {s["cycle_id"] for s in kept}
    why = [(s["cycle_id"], s["hypothesis"], s["reason"], s["sentence"]) for s in steps]
    assert [s["reason"] for s in by_variant["variant 1"]] == ["superseded"] * 2, why
    assert [s["reason"] for s in by_variant["variant 2"]] == ["loss"] * 2, why
    assert all(s["outcome"] == "discarded" for s in by_variant["variant 3"]), why
    # The steps of a round plan one after another, each told what those before it test.
    for round_ in (1, 2):
        told = sorted(
            int(s["hypothesis"].split("beside ")[1].split(" ")[0])
            for s in steps
            if s["round"] == round_
        )
        assert told == [0, 1, 2, 3], why
    for s in steps:
        if s["reason"] == "superseded":
            assert s["confirmation_cycle_id"], s  # confirmed, then not chosen
    # The line holds exactly the kept commits, each a child of the tip it was confirmed on.
    ref = ProjectRef(repo.name, str(repo), "main")
    bare = git.Repo(LocalForge(workers.settings, stores).bare_path(ref))
    history = list(bare.iter_commits(f"{campaign['start_sha']}..{campaign['line_branch']}"))
    assert [c.hexsha for c in history] == [kept[1]["kept_sha"], kept[0]["kept_sha"]]
    for step, commit in zip(reversed(kept), history, strict=True):
        assert [p.hexsha for p in commit.parents] == [step["tip_sha"]]
    assert campaign["cumulative"]["ci_high"] < 1.0, campaign["cumulative"]
