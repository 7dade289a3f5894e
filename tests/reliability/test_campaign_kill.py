"""A campaign under SIGKILLs of its control worker and of its GPU worker: the control worker
dies right after the driver pushed the line to a kept step (before the ops DB recorded it) and
right after it opened the campaign's pull request (before recording that), and the GPU worker
is killed mid-job. Every step is recorded once, the line advances once per kept step, and the
pull request is opened once (docs/design.md, "Research lines")."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.api.main import create_app
from app.cycles.campaigns.models import CampaignStep
from app.cycles.models import Cycle
from app.db import Stores
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.jobs.models import Job, Lease
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend
from tests.integration.campaigns.test_campaign_line import campaign_repo
from tests.integration.queue.conftest import Workers
from tests.reliability.conftest import production_variant_only, variant
from tests.support import alive, bearer, wait_for

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(420),
]

STEPS = 3
# Every step is a real speed-up: each is kept, so the line advances at every step.
AGENT = """
import json, os, pathlib, re
speed = pathlib.Path("speed.py")
delay = float(re.search(r"DELAY = ([0-9.]+)", speed.read_text()).group(1))
speed.write_text(f"DELAY = {delay * 0.6:.4f}\\n")
json.dump({"hypothesis": f"sleeping {delay * 0.6:.4f} s instead of {delay:.4f} s is faster",
           "experiment": "work", "parameters": {}, "what_changed": "speed.py"},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


def _running_job(stores: Stores) -> int | None:
    """The pid of a job's experiment on its first attempt, running now (a kill lands mid-job)."""
    with stores.ops_session() as session:
        row = session.execute(
            select(Lease.pid)
            .join(Job, Lease.job_id == Job.id)
            .where(Job.state == "running", Job.attempts == 1, Lease.pid.is_not(None))
            .limit(1)
        ).first()
    return None if row is None else int(row[0])


def test_a_campaign_survives_sigkills_of_its_control_and_gpu_workers(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    production_variant_only(backend.name)
    settings = workers.settings
    repo = campaign_repo(tmp_path, "line-kill")
    (repo / "agent.py").write_text(AGENT)
    # Long enough that each step's speed-up stands clear of a loaded machine's noise (at 0.5 s
    # a step was once judged inconclusive and not kept, with the suite's other workers busy).
    (repo / "speed.py").write_text("DELAY = 1.0000\n")
    checkout = git.Repo(repo)
    checkout.index.add(["agent.py", "speed.py"])
    actor = git.Actor("t", "t@example.invalid")
    checkout.index.commit("agent: always faster", author=actor, committer=actor)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    once = tmp_path / "faults"
    once.mkdir()
    faults = ["--once-dir", str(once)]
    faults += ["--exit-campaign-at", "advanced", "--exit-campaign-at", "published"]
    workers.start("control", "control", "--beat", faults=faults)
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    began = time.monotonic()

    restarts, gpu_kills = 0, 0
    with TestClient(create_app(settings, stores)) as client:
        made = client.post(
            "/api/v1/campaigns",
            json={"project": repo.name, "max_cycles": STEPS},
            headers=bearer(token),
        )
        assert made.status_code == 202, made.text
        campaign_id = made.json()["id"]

        def campaign() -> dict[str, Any]:
            found: dict[str, Any] = client.get(
                f"/api/v1/campaigns/{campaign_id}", headers=bearer(token)
            ).json()
            return found

        def news() -> tuple[str, Any] | None:
            """What the test acts on next: the control worker died, a job to kill runs, or
            the campaign ended."""
            if workers.procs["control"].poll() is not None:
                return "control died", workers.procs["control"].returncode
            if gpu_kills == 0 and (pid := _running_job(stores)) is not None:
                return "job running", pid
            body = campaign()
            return ("ended", body) if body["state"] in ("finished", "stopped", "failed") else None

        while True:
            what, detail = wait_for(news, timeout=240)
            if what == "ended":
                ended = detail
                break
            if what == "control died":
                assert detail == 137, workers.logs()[-4000:]
                workers.kill("control")  # what it left in its process group goes too
                restarts += 1
                workers.start(f"control{restarts}", "control", "--beat", faults=faults)
                workers.procs["control"] = workers.procs.pop(f"control{restarts}")
            else:
                workers.kill("gpu")
                wait_for(lambda pid=detail: not alive(pid), timeout=10)
                gpu_kills += 1
                workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    wall_s = time.monotonic() - began

    assert ended["state"] == "finished", (ended, workers.logs()[-6000:])
    # Both crashes happened (each once), and the GPU worker was killed mid-job.
    assert sorted(p.name for p in once.iterdir()) == ["advanced.done", "published.done"]
    assert restarts == 2
    assert gpu_kills == 1
    # Every step recorded once: one step row per step cycle, each decided, one confirmation
    # cycle per confirmed step and none made twice.
    steps = ended["steps"]
    assert len(steps) == STEPS
    assert all(s["outcome"] == "kept" for s in steps), steps
    with stores.ops_session() as session:
        roles = dict(
            session.execute(
                select(Cycle.role, func.count())
                .where(Cycle.campaign_id == campaign_id)
                .group_by(Cycle.role)
            ).all()
        )
        rows = session.scalar(
            select(func.count())
            .select_from(CampaignStep)
            .where(CampaignStep.campaign_id == campaign_id)
        )
    assert roles == {"step": STEPS, "confirmation": STEPS, "final": 1}, roles
    assert rows == STEPS
    # The line advanced once per kept step: its history is the kept commits, each a child of
    # the one before.
    ref = ProjectRef(repo.name, str(repo), "main")
    forge = LocalForge(settings, stores)
    bare = git.Repo(forge.bare_path(ref))
    history = [c.hexsha for c in bare.iter_commits(f"{ended['start_sha']}..{ended['line_branch']}")]
    assert history == [s["kept_sha"] for s in reversed(steps)], history
    assert ended["tip_sha"] == history[0]
    # The pull request was opened once, and the campaign records it.
    prs = forge.list_pull_requests(ref)
    assert len(prs) == 1, prs
    assert ended["pr_number"] == prs[0].number
    assert ended["cumulative"]["ci_high"] < 1.0, ended["cumulative"]

    figures[f"campaign_sigkills[{variant(backend.name, settings)}]"] = {
        "faults_injected": restarts + gpu_kills,
        "steps": STEPS,
        "kept": len(steps),
        "prs": len(prs),
        "wall_s": round(wall_s, 1),
    }
