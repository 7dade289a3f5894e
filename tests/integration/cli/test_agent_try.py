"""`autopilot agent try`: the proposal an agent would make now, printed, nothing started."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.integration.cli.test_cli import autopilot
from tests.integration.queue.conftest import make_repo
from tests.llm_server import json_reply, llm_server, reply

KEY = "sk-try-SENTINEL-77"


def registered(tmp_path: Path) -> Path:
    state = tmp_path / "state"
    repo = make_repo(tmp_path, "try-probe")
    assert autopilot(state, "db", "upgrade").returncode == 0
    added = autopilot(state, "project", "create", "--name", "try-probe", "--repo-url", str(repo))
    assert added.returncode == 0, added.stderr
    return state


def cycles(state: Path) -> int:
    with sqlite3.connect(state / "ops.db") as connection:
        return int(connection.execute("SELECT count(*) FROM cycle").fetchone()[0])


def test_the_llm_agent_is_tried_with_its_prompt_replies_and_validation(tmp_path: Path) -> None:
    state = registered(tmp_path)
    good = {
        "hypothesis": "a half-second sleep is judged like the default",
        "experiment": "probe",
        "parameters": {"sleep_s": 0.5},
        "what_changed": "nothing",
        "expected_outcome": "inconclusive",
        "proposed_lessons": [],
    }
    with llm_server(api_key=KEY) as server:
        server.script(reply("no json here"), json_reply(good))
        env = {
            "AUTOPILOT_LLM_BASE_URL": server.base_url,
            "AUTOPILOT_LLM_MODEL": "m",
            "AUTOPILOT_LLM_API_KEY": KEY,
        }
        shown = autopilot(state, "agent", "try", "try-probe", "--agent", "llm", env=env)
        assert shown.returncode == 0, shown.stderr
        assert "--- prompt (system) ---" in shown.stdout and "--- refused ---" in shown.stdout
        assert '"sleep_s": 0.5' in shown.stdout and "tokens: 36" in shown.stdout
        server.script(reply("still no json"), reply("nor here"), reply("nope"))
        failed = autopilot(state, "agent", "try", "try-probe", "--agent", "llm", "--json", env=env)
    assert failed.returncode == 1
    out = json.loads(failed.stdout)
    assert out["proposal"] is None and "no valid proposal in 3 attempts" in out["error"]
    assert len(out["exchange"]) == 3
    assert KEY not in shown.stdout + shown.stderr + failed.stdout + failed.stderr
    assert cycles(state) == 0  # nothing was started


def test_the_sweep_is_tried_and_the_command_agent_is_refused(tmp_path: Path) -> None:
    state = registered(tmp_path)
    swept = autopilot(state, "agent", "try", "try-probe", "--json")
    assert swept.returncode == 0, swept.stderr
    assert json.loads(swept.stdout)["proposal"]["parameters"] == {"sleep_s": 0.05, "grandchild": 0}
    refused = autopilot(state, "agent", "try", "try-probe", "--agent", "command")
    assert refused.returncode == 2
    assert "autopilot cycle run --project try-probe" in refused.stderr
    missing = autopilot(state, "agent", "try", "no-such-project")
    assert missing.returncode == 2 and "no-such-project" in missing.stderr
