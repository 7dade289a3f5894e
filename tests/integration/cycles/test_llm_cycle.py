"""`[agent] kind = "llm"` end to end: real control and GPU workers, the real `openai` client
against an OpenAI-compatible server over real HTTP (tests/llm_server.py, replies scripted).

The model's invalid replies are sent back with their errors until one is valid; the cycle runs
to review on that proposal; the prompt carries the validated finding memory holds; the tokens of
every attempt are counted on the cycle, and the project's daily token budget then defers the
next cycle; the exchange is on the cycle's dashboard page; the key is in no log and no output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import git
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.integration.dashboard.conftest import login
from tests.integration.queue.conftest import Workers, make_repo
from tests.llm_server import json_reply, llm_server, reply
from tests.support import bearer, wait_for

KEY = "sk-test-LLM-SENTINEL-4242"
AGENT = """
[agent]
kind = "llm"
goal = "find the sleep that keeps the probe fast"
max_attempts = 3

[budgets]
llm_tokens_per_day = 50
"""


def test_an_llm_agent_runs_a_cycle_on_its_third_reply(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Any
) -> None:
    if backend.name != "sqlite":
        pytest.skip("the agent's loop does not depend on the stores: one backend")
    repo = make_repo(tmp_path, "llm-probe")
    config = repo / "autopilot.toml"
    config.write_text(config.read_text() + AGENT)
    git.Repo(repo).index.add(["autopilot.toml"])
    actor = git.Actor("t", "t@example.invalid")
    git.Repo(repo).index.commit("an llm agent", author=actor, committer=actor)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="llm-probe", repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    with stores.memory_session() as msession:
        lesson = memory.create(
            msession,
            FindingCreate(project="llm-probe", kind="lesson", statement="short sleeps stay fast"),
            actor="test",
        )
        memory.validate(msession, lesson.id, actor="test")
        lesson_id = lesson.id

    good = {
        "hypothesis": "a 0.2 s sleep is judged like the default",
        "experiment": "probe",
        "parameters": {"sleep_s": 0.2},
        "what_changed": "nothing: a point of the space",
        "expected_outcome": "inconclusive",
        "proposed_lessons": [],
    }
    with llm_server(api_key=KEY) as server:
        server.script(
            reply("I think you should try a longer sleep.", 100, 10),
            json_reply({**good, "parameters": {"sleep_s": 7}}, 120, 20),
            json_reply(good, 140, 30),
        )
        env = {
            "AUTOPILOT_LLM_BASE_URL": server.base_url,
            "AUTOPILOT_LLM_MODEL": "scripted-model",
            "AUTOPILOT_LLM_API_KEY": KEY,
        }
        workers.start("control", "control", env=env)
        workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
        with TestClient(create_app(workers.settings, stores)) as client:

            def run() -> dict[str, Any]:
                cycle_id = client.post(
                    "/api/v1/cycles", json={"project": "llm-probe"}, headers=bearer(token)
                ).json()["id"]

                def ended() -> dict[str, Any] | None:
                    got = client.get(f"/api/v1/cycles/{cycle_id}", headers=bearer(token))
                    body: dict[str, Any] = got.json()
                    done = ("awaiting_review", "failed", "deferred_budget")
                    return body if body["state"] in done else None

                found: dict[str, Any] = wait_for(ended, timeout=300)
                return found

            cycle = run()
            assert cycle["state"] == "awaiting_review", (cycle, workers.logs())
            assert cycle["parameters"] == {"sleep_s": 0.2, "grandchild": 0}
            assert cycle["hypothesis"] == good["hypothesis"]
            assert cycle["agent_tokens"] == 110 + 140 + 170  # every attempt counts
            exchange = cycle["agent_exchange"]
            assert [bool(turn["error"]) for turn in exchange] == [True, True, False]
            assert (
                "sleep_s" in exchange[1]["error"]
                and "outside the declared space" in (exchange[1]["error"])
            )

            first, second = server.requests[0], server.requests[1]
            assert first.headers.get("authorization") == f"Bearer {KEY}"
            prompt = "\n".join(str(m.get("content")) for m in first.messages)
            assert lesson_id in prompt and "short sleeps stay fast" in prompt
            assert "find the sleep that keeps the probe fast" in prompt
            # the first reply's error went back to the model with the next request
            assert exchange[0]["error"] in str(second.messages[-1].get("content"))

            # over the daily budget (420 > 50): the next cycle waits
            deferred = run()
            assert deferred["state"] == "deferred_budget", deferred
            assert "llm_tokens_per_day" in deferred["error"]
            assert len(server.requests) == 3  # the deferred cycle asked the model nothing

            with stores.ops_session() as session:
                _, review = ops.create_token(session, "reviewer", ["review"])
            login(client, review)
            page = client.get(f"/dashboard/cycles/{cycle['id']}").text
            assert "Why the agent proposed this" in page and "420" in page
            assert "I think you should try a longer sleep." in page
            assert KEY not in page
            assert (
                KEY not in client.get(f"/api/v1/cycles/{cycle['id']}", headers=bearer(token)).text
            )
    assert KEY not in workers.logs()
