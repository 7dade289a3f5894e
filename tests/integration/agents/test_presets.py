"""The command agent's coding-agent presets (claude-code, codex) with stand-in CLIs, a real
workspace (a clone of a research repo) and the real sandbox: the argv each preset builds, the
prompt on stdin, the agent's own key passed (and nothing else of ours), the proposal read from
its final message or from AUTOPILOT_PROPOSAL, and the tokens it reports."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from app.agents.exceptions import AgentFailed
from app.agents.service import CommandAgent, Context, Proposal
from app.agents.workspace import Workspace
from app.projects import config as project_config
from app.sandbox import confined
from tests.conftest import REQUIRE_SERVICES
from tests.integration.agents import standins
from tests.integration.queue.conftest import make_repo

KEY = f"sk-test-{uuid.uuid4().hex}"
OURS = f"ours-{uuid.uuid4().hex}"


@pytest.fixture(autouse=True)
def sandbox_on() -> None:
    reason = confined.check()
    if reason and not REQUIRE_SERVICES:
        pytest.skip(f"the sandbox is not available here: {reason}")
    assert reason is None, reason


@pytest.fixture
def space(tmp_path: Path) -> Workspace:
    space = Workspace(tmp_path / "agent")
    space.reset()
    origin = make_repo(tmp_path, "research")
    subprocess.run(["git", "clone", "-q", str(origin), str(space.repo)], check=True)
    return space


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """First on the worker's PATH (which the agent gets); the worker's environment also holds
    the agent's key and secrets of ours that must not reach it."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", standins.path_with(path))
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.setenv("CODEX_API_KEY", KEY)
    monkeypatch.setenv("AUTOPILOT_OPS_URL", f"postgresql://autopilot:{OURS}@db/ops")
    monkeypatch.setenv("AUTOPILOT_LLM_API_KEY", OURS)
    return path


def agent(
    space: Workspace, preset: str, key: str = "ANTHROPIC_API_KEY", **kw: object
) -> CommandAgent:
    fields: dict[str, object] = {
        "argv": [],
        "workspace": space,
        "time_limit_s": 60,
        "run_name": f"test-agent-{uuid.uuid4().hex[:12]}",
        "preset": preset,
        "max_turns": 7,
        "env_passthrough": [key],
        "env_allowed": [key, "SOMETHING_ELSE"],
        **kw,
    }
    return CommandAgent(**fields)  # type: ignore[arg-type]


def propose(space: Workspace, command_agent: CommandAgent) -> Proposal:
    config = project_config.load(space.repo)
    proposal = command_agent.propose(Context("research", "cpu", config))
    assert proposal is not None
    return proposal


def saw_only_its_key(seen: dict[str, object], key: str) -> None:
    assert seen["key_ok"] == {key: True}
    names = seen["env_names"]
    assert isinstance(names, list)
    assert "AUTOPILOT_OPS_URL" not in names
    assert "AUTOPILOT_LLM_API_KEY" not in names
    other = "CODEX_API_KEY" if key == "ANTHROPIC_API_KEY" else "ANTHROPIC_API_KEY"
    assert other not in names  # set in the worker, not asked for: not passed


def test_claude_code_preset(space: Workspace, bin_dir: Path) -> None:
    standins.install(
        bin_dir,
        "claude",
        message=standins.fenced(standins.PROPOSAL),
        keys={"ANTHROPIC_API_KEY": KEY},
    )
    proposal = propose(space, agent(space, "claude-code"))
    assert proposal.to_json() == {
        **{k: standins.PROPOSAL[k] for k in ("hypothesis", "experiment", "parameters")},
        "what_changed": "added probe/tuning.py",
        "expected_outcome": "no change in time",
        "proposed_lessons": ["tuning files are cheap"],
    }
    # The result event's usage: input, cache creation, cache reads and output.
    assert proposal.tokens == 100 + 20 + 300 + 50
    seen = standins.report(space.files)
    assert seen["argv"] == [
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--max-turns",
        "7",
        "--permission-mode",
        "acceptEdits",
        "--add-dir",
        str(space.files),
    ]
    assert seen["prompt"].startswith("# Research cycle for research (cpu)")
    assert "final message" in seen["prompt"]
    assert str(space.files / "context.json") in seen["prompt"]
    assert seen["cwd"] == str(space.repo)
    saw_only_its_key(seen, "ANTHROPIC_API_KEY")
    assert (space.repo / "probe" / "tuning.py").read_text() == "TUNED = True\n"
    assert KEY not in space.output_log.read_text()


def test_codex_preset(space: Workspace, bin_dir: Path) -> None:
    standins.install(
        bin_dir, "codex", message=standins.fenced(standins.PROPOSAL), keys={"CODEX_API_KEY": KEY}
    )
    proposal = propose(space, agent(space, "codex", key="CODEX_API_KEY"))
    assert proposal.hypothesis == standins.PROPOSAL["hypothesis"]
    assert proposal.parameters == {"sleep_s": 0.2}
    # turn.completed: input (the cached ones are part of it) and output.
    assert proposal.tokens == 1000 + 70
    seen = standins.report(space.files)
    assert seen["argv"] == [
        "exec",
        "--json",
        "--sandbox",
        "danger-full-access",
        "--skip-git-repo-check",
        "--output-last-message",
        str(space.files / "last-message.md"),
        "-",
    ]
    assert seen["prompt"].startswith("# Research cycle for research (cpu)")
    saw_only_its_key(seen, "CODEX_API_KEY")
    assert (space.repo / "probe" / "tuning.py").exists()


def test_codex_final_message_from_its_events(space: Workspace, bin_dir: Path) -> None:
    """No last-message file: the last agent_message item; a bare JSON object in prose."""
    message = "Proposal: " + standins.json.dumps({**standins.PROPOSAL, "hypothesis": "bare"})
    standins.install(bin_dir, "codex", message=message, write_last=False)
    proposal = propose(space, agent(space, "codex", key="CODEX_API_KEY"))
    assert proposal.hypothesis == "bare"
    assert not (space.files / "last-message.md").exists()


def test_command_names_the_program(space: Workspace, bin_dir: Path, tmp_path: Path) -> None:
    """`command = ["/opt/.../claude"]` with the preset: that program, the preset's flags."""
    elsewhere = standins.install(
        tmp_path / "opt" / "claude-code" / "bin",
        "claude",
        message=standins.fenced(standins.PROPOSAL),
    )
    proposal = propose(space, agent(space, "claude-code", argv=[str(elsewhere)]))
    assert proposal.tokens == 470
    assert standins.report(space.files)["argv"][:3] == ["-p", "--output-format", "stream-json"]
    assert not (bin_dir / "claude").exists()


def test_proposal_file_wins_over_the_final_message(space: Workspace, bin_dir: Path) -> None:
    written = {**standins.PROPOSAL, "hypothesis": "from proposal.json", "tokens": 5}
    standins.install(
        bin_dir, "claude", message=standins.fenced(standins.PROPOSAL), proposal_file=written
    )
    proposal = propose(space, agent(space, "claude-code"))
    assert proposal.hypothesis == "from proposal.json"
    assert proposal.tokens == 470  # what the CLI reports, not what the agent wrote


def test_variable_the_operator_did_not_allow(space: Workspace, bin_dir: Path) -> None:
    standins.install(bin_dir, "claude", message=standins.fenced(standins.PROPOSAL))
    with pytest.raises(AgentFailed) as failed:
        propose(space, agent(space, "claude-code", env_allowed=["OPENAI_API_KEY"]))
    assert "ANTHROPIC_API_KEY" in failed.value.detail
    assert "AUTOPILOT_AGENT_ENV_PASSTHROUGH" in failed.value.detail
    assert KEY not in failed.value.detail
    assert not (space.files / "standin-report.json").exists()  # it never ran


def test_variable_allowed_but_unset(
    space: Workspace, bin_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    standins.install(bin_dir, "claude", message=standins.fenced(standins.PROPOSAL))
    with pytest.raises(AgentFailed, match="ANTHROPIC_API_KEY.*not set"):
        propose(space, agent(space, "claude-code"))
    assert not (space.files / "standin-report.json").exists()


def test_final_message_without_json(space: Workspace, bin_dir: Path) -> None:
    standins.install(bin_dir, "claude", message="I looked around and found nothing to try.")
    with pytest.raises(AgentFailed, match="final message holds no JSON object"):
        propose(space, agent(space, "claude-code"))


def test_final_message_with_a_bad_proposal(space: Workspace, bin_dir: Path) -> None:
    bad = {k: v for k, v in standins.PROPOSAL.items() if k != "experiment"}
    standins.install(bin_dir, "codex", message=standins.fenced(bad))
    with pytest.raises(AgentFailed, match="the final message: 'experiment' must be a str"):
        propose(space, agent(space, "codex", key="CODEX_API_KEY"))


def test_turn_limit_says_what_to_raise(space: Workspace, bin_dir: Path) -> None:
    standins.install(bin_dir, "claude", message="", subtype="error_max_turns", exit=1)
    with pytest.raises(
        AgentFailed, match=r"exited with 1 \(claude ended with 'error_max_turns'.*max_turns"
    ):
        propose(space, agent(space, "claude-code"))
