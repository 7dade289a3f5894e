"""The LLM agent against a real OpenAI-compatible HTTP server (tests/llm_server.py), through the
real openai client, with a real git clone as its workspace: replies are scripted, nothing of
openai is mocked."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from app.agents.exceptions import AgentFailed
from app.agents.llm import LLMAgent
from app.agents.service import Context
from app.agents.workspace import Workspace
from app.projects.config import ProjectConfig, parse
from app.settings import Settings
from tests.llm_server import (
    LLMServer,
    Scripted,
    held,
    json_reply,
    llm_server,
    no_usage,
    rate_limited,
    reply,
    server_error,
)

KEY = "sk-sentinel-" + uuid.uuid4().hex
CONFIG = """\
[project]
name = "probe"
protected_paths = ["probe/main.py", "secrets"]

[experiments.probe]
entry = "probe.main"
parameters = { block = [16, 32, 64], unroll = [1, 2] }
defaults = { block = 16, unroll = 1 }

[agent]
kind = "llm"
goal = "Make the probe faster without losing accuracy."
max_attempts = 3
time_limit_s = 60
"""
TUNING = "BLOCK = 16\nUNROLL = 1\n"
GOOD: dict[str, Any] = {
    "hypothesis": "block 32 halves the loop overhead: the probe runs 10% faster",
    "experiment": "probe",
    "parameters": {"block": 32},
    "what_changed": "block 16 -> 32",
    "expected_outcome": "a faster verdict, ratio about 0.9",
    "proposed_lessons": ["wider blocks amortise the loop"],
}
TUNING_DIFF = """\
diff --git a/probe/tuning.py b/probe/tuning.py
--- a/probe/tuning.py
+++ b/probe/tuning.py
@@ -1,2 +1,2 @@
-BLOCK = 16
+BLOCK = 32
 UNROLL = 1
"""
STALE_DIFF = """\
diff --git a/probe/tuning.py b/probe/tuning.py
--- a/probe/tuning.py
+++ b/probe/tuning.py
@@ -1,2 +1,2 @@
-BLOCK = 8
+BLOCK = 32
 UNROLL = 1
"""


def protected_diff(path: str) -> str:
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )


def git(cwd: Path, *args: str) -> str:
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd), "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def config() -> ProjectConfig:
    return parse(CONFIG)


@pytest.fixture
def workspace(tmp_path: Path) -> Workspace:
    """A research repository and the agent's scratch clone of its base commit."""
    origin = tmp_path / "origin"
    (origin / "probe").mkdir(parents=True)
    (origin / "autopilot.toml").write_text(CONFIG)
    (origin / "probe" / "__init__.py").write_text("")
    (origin / "probe" / "main.py").write_text("x = 1\n")
    (origin / "probe" / "tuning.py").write_text(TUNING)
    git(origin, "init", "-q", "-b", "main")
    git(origin, "add", ".")
    git(origin, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", "probe")
    space = Workspace(tmp_path / "agent")
    space.reset()
    git(tmp_path, "clone", "-q", str(origin), str(space.repo))
    return space


@pytest.fixture
def server() -> Iterator[LLMServer]:
    with llm_server(api_key=KEY) as running:
        yield running


def context(config: ProjectConfig, covered: set[str] | None = None) -> Context:
    def is_covered(experiment: str, parameters: dict[str, Any]) -> bool:
        return json.dumps([experiment, parameters], sort_keys=True) in (covered or set())

    return Context(
        project="probe",
        device_kind="h100",
        config=config,
        related=[
            {
                "id": 42,
                "kind": "speedup",
                "status": "validated",
                "statement": "unroll 2 is 8% faster at block 16",
            },
            {
                "id": 43,
                "kind": "speedup",
                "status": "refuted",
                "statement": "block 64 spills registers",
            },
        ],  # fmt: skip
        recent=[
            {
                "id": 7,
                "experiment": "probe",
                "parameters": {"block": 16, "unroll": 2},
                "hypothesis": "unrolling twice hides latency",
                "verdict": "faster",
                "ratio": 0.92,
                "ci_low": 0.9,
                "ci_high": 0.94,
                "state": "merged",
            },
        ],  # fmt: skip
        judged=[
            {
                "experiment": "probe",
                "parameters": {"block": 16, "unroll": 2},
                "verdict": "faster",
                "finding": 42,
            },
        ],  # fmt: skip
        is_covered=is_covered,
    )


def covering(experiment: str, parameters: dict[str, Any]) -> set[str]:
    return {json.dumps([experiment, parameters], sort_keys=True)}


def agent(
    server: LLMServer,
    config: ProjectConfig,
    workspace: Workspace | None,
    **overrides: Any,
) -> LLMAgent:
    values: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "test-model",
        "api_key": SecretStr(KEY),
        "timeout_s": 10.0,
        "config": config.agent,
        "workspace": workspace,
        "time_limit_s": 60.0,
        "run_name": f"llm-test-{uuid.uuid4().hex[:8]}",
        "sandboxed": False,
        "max_retries": 0,
    }
    return LLMAgent(**(values | overrides))


def test_a_valid_reply_is_the_proposal(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(json_reply(GOOD, prompt_tokens=120, completion_tokens=30))
    llm = agent(server, config, workspace)
    proposal = llm.propose(context(config))
    assert proposal.experiment == "probe"
    assert proposal.parameters == {"block": 32, "unroll": 1}  # the default filled in
    assert proposal.hypothesis == GOOD["hypothesis"]
    assert proposal.changes == "block 16 -> 32"
    assert proposal.expected == GOOD["expected_outcome"]
    assert proposal.lessons == ["wider blocks amortise the loop"]
    assert proposal.tokens == 150
    assert proposal.exchange is llm.exchange
    (record,) = proposal.exchange
    assert record["attempt"] == 1
    assert record["reply"] == json.dumps(GOOD)
    assert record["usage"] == {"prompt_tokens": 120, "completion_tokens": 30, "total_tokens": 150}
    assert record["error"] is None
    assert record["request"]["model"] == "test-model"
    assert record["request"]["response_format"] == "json_schema"
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["model"] == "test-model"
    assert sent.body["temperature"] == config.agent.temperature
    assert sent.body["max_tokens"] == config.agent.max_tokens
    schema = sent.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["experiment"]["enum"] == ["probe"]
    assert "diff" in schema["properties"]
    assert record["request"]["messages"] == sent.messages
    assert (workspace.repo / "probe" / "tuning.py").read_text() == TUNING


def test_the_prompt_carries_the_context(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(json_reply(GOOD))
    agent(server, config, workspace).propose(context(config))
    system, user = (m["content"] for m in server.requests[0].messages)
    assert server.requests[0].messages[0]["role"] == "system"
    assert '"proposed_lessons"' in system and "JSON" in system  # the schema and the format
    assert "Accuracy before speed" in system
    assert "probe/main.py" in system and "autopilot.toml" in system
    assert "Make the probe faster without losing accuracy." in user
    assert "finding 42 [validated, speedup]: unroll 2 is 8% faster at block 16" in user
    assert "finding 43 [refuted, speedup]: block 64 spills registers" in user
    assert "unrolling twice hides latency" in user
    assert "ratio 0.92 (95% CI 0.9 to 0.94)" in user
    assert 'probe {"block": 16, "unroll": 2}: faster (finding 42)' in user
    assert '{"block": [16, 32, 64], "unroll": [1, 2]}' in user
    assert "lower is better" in user and "h100" in user
    assert "probe/tuning.py" in user  # the repository's files, for a diff


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (reply("I think block 32 is best."), "the reply is not JSON"),
        (json_reply([GOOD]), "the reply must be a JSON object, not a JSON array"),
        (json_reply({**GOOD, "parameters": {"block": 128}}),
         "parameter block=128 is outside the declared space [16, 32, 64]"),
        (json_reply({**GOOD, "parameters": {"threads": 4}}), "parameter 'threads' is not declared"),
        (json_reply({**GOOD, "experiment": "other"}), "experiment 'other' is not declared"),
        (json_reply({k: v for k, v in GOOD.items() if k != "hypothesis"}),
         "missing key 'hypothesis'"),
        (json_reply({**GOOD, "parameters": [32]}), "'parameters' must be an object"),
        (json_reply({**GOOD, "confidence": 0.9}), "unknown key 'confidence'"),
    ],
)  # fmt: skip
def test_a_refused_reply_goes_back_with_its_error(
    server: LLMServer, config: ProjectConfig, workspace: Workspace, bad: Scripted, error: str
) -> None:
    server.script(bad, json_reply(GOOD))
    llm = agent(server, config, workspace)
    proposal = llm.propose(context(config))
    assert proposal.parameters == {"block": 32, "unroll": 1}
    first, second = llm.exchange
    assert error in first["error"]
    retry = server.requests[1].messages
    assert retry[:2] == server.requests[0].messages
    assert retry[2] == {"role": "assistant", "content": bad.content}
    assert retry[3]["role"] == "user" and first["error"] in retry[3]["content"]
    assert second["error"] is None


def test_tokens_are_summed_over_every_attempt(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(reply("not json", 10, 5), no_usage("still not"), json_reply(GOOD, 20, 7))
    proposal = agent(server, config, workspace).propose(context(config))
    assert proposal.tokens == 10 + 5 + 20 + 7


def test_no_usage_reported_is_zero_tokens(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(no_usage(json.dumps(GOOD)))
    assert agent(server, config, workspace).propose(context(config)).tokens == 0


def test_a_judged_point_is_refused(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    other = {**GOOD, "parameters": {"block": 32, "unroll": 2}}
    server.script(json_reply(GOOD), json_reply(other))
    llm = agent(server, config, workspace)
    proposal = llm.propose(context(config, covering("probe", {"block": 32, "unroll": 1})))
    assert proposal.parameters == {"block": 32, "unroll": 2}
    assert llm.exchange[0]["error"] == (
        "already judged or running: probe with block=32, unroll=1; propose another point of "
        "the declared space"
    )


def test_max_attempts_exhausted_fails_with_the_last_error(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(reply("no"), json_reply({**GOOD, "parameters": {"block": 1}}), reply("[1]", 3, 4))
    llm = agent(server, config, workspace)
    with pytest.raises(AgentFailed) as failed:
        llm.propose(context(config))
    assert failed.value.detail == (
        "the model gave no valid proposal in 3 attempts: the reply must be a JSON object, not "
        "a JSON array"
    )
    assert [r["attempt"] for r in llm.exchange] == [1, 2, 3]
    assert llm.tokens == 11 + 7 + 11 + 7 + 3 + 4  # kept for the failed cycle
    assert server.left == 0


@pytest.mark.parametrize("sandboxed", [False, True])
def test_a_diff_that_applies_changes_the_clone(
    server: LLMServer, config: ProjectConfig, workspace: Workspace, sandboxed: bool
) -> None:
    server.script(json_reply({**GOOD, "diff": TUNING_DIFF}))
    proposal = agent(server, config, workspace, sandboxed=sandboxed).propose(context(config))
    assert proposal.parameters == {"block": 32, "unroll": 1}
    assert (workspace.repo / "probe" / "tuning.py").read_text() == "BLOCK = 32\nUNROLL = 1\n"
    assert git(workspace.repo, "status", "--porcelain").strip() == "M probe/tuning.py"


def test_a_diff_that_does_not_apply_goes_back(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(json_reply({**GOOD, "diff": STALE_DIFF}), json_reply({**GOOD, "diff": None}))
    llm = agent(server, config, workspace)
    llm.propose(context(config))
    error = llm.exchange[0]["error"]
    assert error.startswith("the diff does not apply to the base commit: ")
    assert "patch does not apply" in error  # git apply's own words
    assert error in server.requests[1].messages[-1]["content"]
    assert (workspace.repo / "probe" / "tuning.py").read_text() == TUNING


@pytest.mark.parametrize(
    ("path", "guarded"),
    [("probe/main.py", "probe/main.py"), ("autopilot.toml", "autopilot.toml"),
     ("secrets/key.txt", "secrets")],
)  # fmt: skip
def test_a_diff_on_a_protected_path_is_refused(
    server: LLMServer, config: ProjectConfig, workspace: Workspace, path: str, guarded: str
) -> None:
    server.script(json_reply({**GOOD, "diff": protected_diff(path)}), json_reply(GOOD))
    llm = agent(server, config, workspace)
    llm.propose(context(config))
    assert f"the diff touches the protected path {guarded!r} ({path})" in llm.exchange[0]["error"]
    assert git(workspace.repo, "status", "--porcelain") == ""


def test_a_rename_of_a_protected_path_is_refused(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    rename = (
        "diff --git a/probe/main.py b/probe/moved.py\nsimilarity index 100%\n"
        "rename from probe/main.py\nrename to probe/moved.py\n"
    )
    server.script(json_reply({**GOOD, "diff": rename}), json_reply(GOOD))
    llm = agent(server, config, workspace)
    llm.propose(context(config))
    assert "the diff touches the protected path 'probe/main.py'" in llm.exchange[0]["error"]
    assert (workspace.repo / "probe" / "main.py").exists()


def test_without_a_workspace_no_diff_is_taken(server: LLMServer, config: ProjectConfig) -> None:
    server.script(json_reply({**GOOD, "diff": TUNING_DIFF}), json_reply({**GOOD, "diff": None}))
    llm = agent(server, config, None)
    llm.propose(context(config))
    assert llm.exchange[0]["error"] == "this cycle takes no code change: set 'diff' to null"
    schema = server.requests[0].body["response_format"]["json_schema"]["schema"]
    assert "diff" not in schema["properties"]


def test_rate_limited_then_a_reply(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(
        rate_limited("0.4"), reply("oops", 10, 5), rate_limited(), json_reply(GOOD, 20, 7)
    )
    llm = agent(server, config, workspace)
    started = time.monotonic()
    proposal = llm.propose(context(config))
    assert time.monotonic() - started >= 0.4  # Retry-After honoured
    assert proposal.tokens == 42
    assert [r["attempt"] for r in llm.exchange] == [1, 1, 2, 2]
    assert llm.exchange[0]["error"].startswith("RateLimitError (429): ")
    assert len(server.requests) == 4


def test_the_clients_own_retries_come_first(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(rate_limited("0.1"), json_reply(GOOD))
    llm = agent(server, config, workspace, max_retries=2)
    llm.propose(context(config))
    assert len(server.requests) == 2  # the client retried
    assert len(llm.exchange) == 1 and llm.exchange[0]["error"] is None


def test_rate_limited_past_the_time_limit_fails(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(rate_limited("30"))
    llm = agent(server, config, workspace, time_limit_s=5.0)
    started = time.monotonic()
    with pytest.raises(AgentFailed) as failed:
        llm.propose(context(config))
    assert time.monotonic() - started < 5
    assert "within the agent's time limit of 5 s: RateLimitError (429)" in failed.value.detail


def test_a_timed_out_request_is_retried(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(held(10), json_reply(GOOD))
    llm = agent(server, config, workspace, timeout_s=0.5)
    proposal = llm.propose(context(config))
    assert proposal.parameters == {"block": 32, "unroll": 1}
    assert llm.exchange[0]["error"].startswith("APITimeoutError")


def test_timeouts_until_the_time_limit_fail(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(*[held(10) for _ in range(10)])
    llm = agent(server, config, workspace, timeout_s=0.5, time_limit_s=2.0)
    started = time.monotonic()
    with pytest.raises(AgentFailed) as failed:
        llm.propose(context(config))
    assert time.monotonic() - started < 4
    assert "time limit of 2 s" in failed.value.detail
    assert "APITimeoutError" in failed.value.detail


def test_json_schema_rejected_falls_back_to_json_object(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.rejected_formats = {"json_schema"}
    server.script(reply("not json"), json_reply(GOOD))
    llm = agent(server, config, workspace)
    llm.propose(context(config))
    assert [r.response_format for r in server.requests] == [
        "json_schema", "json_object", "json_object"
    ]  # fmt: skip
    assert llm.mode == "json_object"
    assert "response_format type 'json_schema' is not supported" in llm.exchange[0]["error"]


def test_a_500_naming_the_format_falls_back_too(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(server_error(500, "failed to parse grammar from json_schema"), json_reply(GOOD))
    agent(server, config, workspace).propose(context(config))
    assert [r.response_format for r in server.requests] == ["json_schema", "json_object"]


def test_no_response_format_at_all_reads_plain_text(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.rejected_formats = {"json_schema", "json_object"}
    server.script(
        reply(f"Here is my proposal:\n```json\n{json.dumps(GOOD, indent=2)}\n```\nGood luck!")
    )
    llm = agent(server, config, workspace)
    proposal = llm.propose(context(config))
    assert proposal.parameters == {"block": 32, "unroll": 1}
    assert [r.response_format for r in server.requests] == ["json_schema", "json_object", None]
    assert llm.exchange[-1]["request"]["response_format"] is None


def test_options_a_model_does_not_take_are_dropped(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    # What OpenAI's reasoning models answer to max_tokens and a temperature.
    server.script(
        server_error(400, "Unsupported parameter: 'max_tokens' is not supported with this "
                     "model. Use 'max_completion_tokens' instead."),
        server_error(400, "Unsupported value: 'temperature' does not support 0.2 with this "
                     "model. Only the default (1) value is supported."),
        reply("not json"),
        json_reply(GOOD),
    )  # fmt: skip
    llm = agent(server, config, workspace)
    llm.propose(context(config))
    first, second, third, fourth = (r.body for r in server.requests)
    assert first["max_tokens"] == 4096 and "max_completion_tokens" not in first
    assert second["max_completion_tokens"] == 4096 and "max_tokens" not in second
    assert second["temperature"] == 0.2
    assert "temperature" not in third and "temperature" not in fourth
    assert fourth["max_completion_tokens"] == 4096
    assert llm.exchange[-1]["request"]["temperature"] is None


def test_an_error_the_endpoint_will_repeat_fails_at_once(
    server: LLMServer, config: ProjectConfig, workspace: Workspace
) -> None:
    server.script(server_error(404, "The model `test-model` does not exist"))
    with pytest.raises(AgentFailed) as failed:
        agent(server, config, workspace).propose(context(config))
    assert "refused the request: NotFoundError (404): The model `test-model` does not exist" in (
        failed.value.detail
    )
    assert len(server.requests) == 1


def test_the_key_goes_to_the_endpoint_only(
    server: LLMServer,
    config: ProjectConfig,
    workspace: Workspace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Every git the agent starts records its environment; the key is also in ours.
    wrappers, seen = tmp_path / "bin", tmp_path / "git-env"
    wrappers.mkdir()
    (wrappers / "git").write_text(
        f'#!/bin/sh\n/usr/bin/env >> "{seen}"\necho ---- >> "{seen}"\nexec /usr/bin/git "$@"\n'
    )
    (wrappers / "git").chmod(stat.S_IRWXU)
    monkeypatch.setenv("PATH", f"{wrappers}:{os.environ['PATH']}")
    monkeypatch.setenv("AUTOPILOT_LLM_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    caplog.set_level(logging.DEBUG)
    server.script(
        rate_limited("0.1"),
        json_reply({**GOOD, "diff": STALE_DIFF}),
        json_reply({**GOOD, "diff": protected_diff("probe/main.py")}),
        server_error(401, f"Incorrect API key provided: {KEY}"),
    )
    llm = agent(server, config, workspace)
    with pytest.raises(AgentFailed) as failed:
        llm.propose(context(config))
    assert "AuthenticationError (401): Incorrect API key provided: ***" in failed.value.detail
    assert all(r.headers["authorization"] == f"Bearer {KEY}" for r in server.requests)
    assert len(server.requests) == 4
    assert KEY not in str(failed.value)
    assert KEY not in json.dumps(llm.exchange)
    assert KEY not in caplog.text
    assert "---" in seen.read_text()  # git ran, through the wrapper
    assert KEY not in seen.read_text()
    assert "AUTOPILOT_" not in seen.read_text() and "OPENAI" not in seen.read_text()


def test_from_settings(config: ProjectConfig, workspace: Workspace) -> None:
    def settings(**values: Any) -> Settings:
        return Settings(_env_file=None, **values)  # type: ignore[call-arg]

    with pytest.raises(AgentFailed, match="AUTOPILOT_LLM_BASE_URL"):
        LLMAgent.from_settings(settings(), config.agent, workspace, "agent-1")
    with pytest.raises(AgentFailed, match=r"AUTOPILOT_LLM_MODEL or \[agent\] model"):
        LLMAgent.from_settings(
            settings(llm_base_url="http://127.0.0.1:1/v1"), config.agent, workspace, "agent-1"
        )
    built = LLMAgent.from_settings(
        settings(
            llm_base_url="http://127.0.0.1:1/v1",
            llm_model="served",
            llm_api_key=KEY,
            llm_timeout_s=7,
            sandbox="off",
        ),
        config.agent.model_copy(update={"model": "chosen"}),
        workspace,
        "agent-1",
    )
    assert (built.model, built.timeout_s, built.sandboxed) == ("chosen", 7, False)
    assert built.api_key is not None and built.api_key.get_secret_value() == KEY
    assert built.time_limit_s == config.agent.time_limit_s and built.run_name == "agent-1"
    assert KEY not in repr(built)


def test_a_server_without_a_key_gets_a_placeholder(
    config: ProjectConfig, workspace: Workspace
) -> None:
    with llm_server() as open_server:
        open_server.script(json_reply(GOOD))
        agent(open_server, config, workspace, api_key=None).propose(context(config))
        assert open_server.requests[0].headers["authorization"] == "Bearer no-key"
