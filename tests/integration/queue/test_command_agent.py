"""The command agent: a real subprocess edits the worktree and writes proposal.json; a coding-agent
preset (a stand-in `claude`) through a whole cycle."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.sandbox import confined
from tests.integration.agents import standins
from tests.integration.queue.conftest import Workers, make_repo
from tests.support import bearer, wait_for

AGENT = """
import json, os, pathlib
context = json.load(open(os.environ["AUTOPILOT_CONTEXT"]))
assert context["project"], "the context names the project"
assert "AUTOPILOT_OPS_URL" not in os.environ, "no service settings reach the agent"
pathlib.Path({target!r}).write_text("TUNED = True\\n")
json.dump({{"hypothesis": "a tuned probe sleeps the same", "experiment": "probe",
           "parameters": {{"sleep_s": 0.2}}, "what_changed": "added {target}",
           "proposed_lessons": ["tuning files are cheap"], "tokens": 1234}},
          open(os.environ["AUTOPILOT_PROPOSAL"], "w"))
"""


def agent_repo(root: Path, name: str, target: str) -> Path:
    repo_dir = make_repo(root, name)
    config = repo_dir / "autopilot.toml"
    config.write_text(
        config.read_text().replace(
            "python_requirements = []",
            'python_requirements = []\nprotected_paths = ["probe/main.py"]',
        )
        + f'\n[agent]\nkind = "command"\ncommand = ["{sys.executable}", "agent.py"]\n'
        "time_limit_s = 60\n"
    )
    (repo_dir / "agent.py").write_text(AGENT.format(target=target))
    repo = git.Repo(repo_dir)
    repo.index.add(["autopilot.toml", "agent.py"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("command agent", author=actor, committer=actor)
    return repo_dir


def run_cycle(client: TestClient, token: str, project: str) -> dict:  # type: ignore[type-arg]
    cycle_id = client.post(
        "/api/v1/cycles", json={"project": project}, headers=bearer(token)
    ).json()["id"]

    def ended() -> dict | None:  # type: ignore[type-arg]
        body = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token)).json()
        return body if body["state"] in ("awaiting_review", "failed") else None

    return wait_for(ended, timeout=180)


def test_command_agent_edits_and_proposes(workers: Workers, stores: Stores, tmp_path: Path) -> None:
    good = agent_repo(tmp_path, "agent-good", "probe/tuning.py")
    bad = agent_repo(tmp_path, "agent-bad", "probe/main.py")
    with stores.ops_session() as session:
        for repo in (good, bad):
            ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(workers.settings, stores)) as client:
        cycle = run_cycle(client, token, "agent-good")
        assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
        assert cycle["agent_tokens"] == 1234
        assert cycle["parameters"] == {"sleep_s": 0.2, "grandchild": 0}
        refused = run_cycle(client, token, "agent-bad")
    # The agent's change is in the cycle's commit, next to the report.
    bare = workers.settings.state_dir.absolute() / "forge" / "agent-good.git"
    shown = subprocess.run(
        ["git", "--git-dir", str(bare), "show", f"{cycle['branch']}:probe/tuning.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown == "TUNED = True\n"
    # Editing the judge is refused before any GPU time is spent.
    assert refused["state"] == "failed"
    assert "probe/main.py" in refused["error"]
    assert refused["job_id"] is None


def preset_repo(root: Path, name: str, passthrough: str) -> Path:
    repo_dir = make_repo(root, name)
    config = repo_dir / "autopilot.toml"
    config.write_text(
        config.read_text()
        + '\n[agent]\nkind = "command"\npreset = "claude-code"\nmax_turns = 5\n'
        + f'env_passthrough = ["{passthrough}"]\ntime_limit_s = 60\n'
    )
    repo = git.Repo(repo_dir)
    repo.index.add(["autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    repo.index.commit("claude-code agent", author=actor, committer=actor)
    return repo_dir


@pytest.mark.parametrize("queue_sandbox", ["on"])
def test_claude_code_preset_cycle(workers: Workers, stores: Stores, tmp_path: Path) -> None:
    """A full cycle through real workers with the claude-code preset (a stand-in `claude` on
    the control worker's PATH), sandboxed: its key reaches it, the service's settings do not,
    its edit lands on the cycle's branch and its reported tokens on the cycle."""
    if reason := confined.check():
        pytest.skip(f"the sandbox is not available here: {reason}")
    key, ours = f"sk-test-{uuid.uuid4().hex}", f"ours-{uuid.uuid4().hex}"
    bin_dir = tmp_path / "bin"
    standins.install(
        bin_dir,
        "claude",
        message=standins.fenced(standins.PROPOSAL),
        keys={"ANTHROPIC_API_KEY": key},
    )
    good = preset_repo(tmp_path, "claude-good", "ANTHROPIC_API_KEY")
    refused = preset_repo(tmp_path, "claude-refused", "OPENAI_API_KEY")
    with stores.ops_session() as session:
        for repo in (good, refused):
            ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    env = {
        "PATH": standins.path_with(bin_dir),
        "ANTHROPIC_API_KEY": key,
        "OPENAI_API_KEY": key,
        "AUTOPILOT_AGENT_ENV_PASSTHROUGH": '["ANTHROPIC_API_KEY"]',
        "AUTOPILOT_LLM_API_KEY": ours,
    }
    workers.start("control", "control", env=env)
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    with TestClient(create_app(workers.settings, stores)) as client:
        cycle = run_cycle(client, token, "claude-good")
        assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
        failed = run_cycle(client, token, "claude-refused")
    assert cycle["agent_tokens"] == 100 + 20 + 300 + 50
    assert cycle["hypothesis"] == standins.PROPOSAL["hypothesis"]
    files = workers.settings.state_dir.absolute() / "cycles" / str(cycle["id"]) / "agent"
    seen = standins.report(files / "work" / "files")
    assert seen["key_ok"] == {"ANTHROPIC_API_KEY": True}
    assert not {"AUTOPILOT_OPS_URL", "AUTOPILOT_LLM_API_KEY", "OPENAI_API_KEY"} & set(
        seen["env_names"]
    )
    bare = workers.settings.state_dir.absolute() / "forge" / "claude-good.git"
    shown = subprocess.run(
        ["git", "--git-dir", str(bare), "show", f"{cycle['branch']}:probe/tuning.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert shown == "TUNED = True\n"
    # A variable the operator did not allow: refused before the agent runs, named.
    assert failed["state"] == "failed"
    assert "OPENAI_API_KEY" in failed["error"]
    assert "AUTOPILOT_AGENT_ENV_PASSTHROUGH" in failed["error"]
    assert key not in failed["error"]
