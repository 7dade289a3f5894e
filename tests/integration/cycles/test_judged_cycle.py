"""A whole cycle whose experiment lies (lesson 9): a real harness experiment whose variant is
clearly slower rewrites its result.json to claim `faster` before it exits. The cycle settles
with the control plane's verdict, the job keeps the raw claim, and the committed REPORT.md
carries the warning."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.queue.conftest import Workers
from tests.support import bearer, wait_for

# A verdict on measured speed: one at a time (tests/conftest.py, `timing`).
pytestmark = pytest.mark.timing

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"
python_requirements = []

[experiments.slowdown]
entry = "forged.main"
time_limit_s = 120

[experiments.slowdown.tolerance]
rtol = 1e-4
atol = 1e-6

[experiments.slowdown.parameters]
n = [48]

[experiments.slowdown.defaults]
n = 48
"""

FORGED = '''
"""A harness experiment whose variant does twelve products where the baseline does one; it
then forges its verdict, rewriting result.json to claim `faster` before it exits."""
import json
import sys

import torch
from autopilot_harness import Case, Experiment, Variant, run


def build(ctx):
    n = int(ctx.parameters["n"])
    x = torch.randn(n, n, dtype=torch.float64) / n

    def padded():
        y = x
        for _ in range(12):
            y = x @ x
        return y

    return Case(Variant("plain", lambda: x @ x), [Variant("padded", padded)])


code, result, path = run({"slowdown": Experiment(build=build, default_repeats=10)})
if result["status"] == "ok":
    result["verdict"] = result["headline"]["verdict"] = "faster"
    result["comparisons"][0]["verdict"] = "faster"
    path.write_text(json.dumps(result))
sys.exit(code)
'''


def forged_repo(root: Path, name: str) -> Path:
    repo_dir = root / name
    (repo_dir / "forged").mkdir(parents=True)
    (repo_dir / "forged" / "__init__.py").write_text("")
    (repo_dir / "forged" / "main.py").write_text(textwrap.dedent(FORGED))
    (repo_dir / "autopilot.toml").write_text(CONFIG.format(name=name))
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["forged/__init__.py", "forged/main.py", "autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("forged project", author=actor, committer=actor)
    return repo_dir


def test_a_forged_verdict_settles_with_the_control_planes_verdict(
    workers: Workers, stores: Stores, tmp_path: Path
) -> None:
    settings = workers.settings
    repo = forged_repo(tmp_path, "forged-cycle")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="forged-cycle", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(settings, stores)) as client:
        created = client.post(
            "/api/v1/cycles",
            json={"project": "forged-cycle", "experiment": "slowdown", "parameters": {"n": 48}},
            headers=bearer(token),
        )
        assert created.status_code == 201, created.text
        cycle_id = created.json()["id"]

        def ended() -> dict | None:  # type: ignore[type-arg]
            body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
            return body if body["state"] in ("awaiting_review", "failed") else None

        cycle = wait_for(ended, timeout=300)
    assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
    assert cycle["verdict"] == "slower", cycle
    assert cycle["headline"]["verdict"] == "slower" and cycle["headline"]["ratio"] > 1, cycle
    assert cycle["headline"]["disagreements"] == 1, cycle

    with stores.ops_session() as session:
        job = session.query(Job).filter_by(cycle_id=cycle_id).one()
        assert job.result is not None and job.result["verdict"] == "faster"  # the raw claim

    bare = settings.state_dir.absolute() / "forge" / "forged-cycle.git"

    def show(name: str) -> str:
        return subprocess.run(
            ["git", "--git-dir", str(bare), "show", f"{cycle['branch']}:results/{cycle_id}/{name}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    committed = json.loads(show("result.json"))
    assert committed["verdict"] == committed["comparisons"][0]["verdict"] == "slower"
    assert committed["judgement"]["by"] == "control-plane"
    assert committed["judgement"]["self_reported"]["verdict"] == "faster"
    report = show("REPORT.md")
    assert "**Verdict: slower**" in report
    assert "> [!WARNING]" in report
    assert (
        "The experiment reported `faster` for padded; the control plane computed `slower` "
        "from its samples." in report
    )
