"""Stand-ins for the coding-agent CLIs: Python scripts named `claude` and `codex` that behave as
their vendors document the headless mode (see app/agents/presets.py for the sources): read the
prompt on stdin, edit the working directory, print the documented events with the proposal in
the final message. Each writes what it saw to `standin-report.json` in its HOME (the agent's
files dir) for the test to check."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# The base interpreter: the system paths the sandbox binds hold it, unlike the checkout's venv.
PYTHON = str(Path(sys.base_prefix, "bin", "python3"))

PROPOSAL = {
    "hypothesis": "a tuned probe sleeps the same",
    "experiment": "probe",
    "parameters": {"sleep_s": 0.2},
    "what_changed": "added probe/tuning.py",
    "expected_outcome": "no change in time",
    "proposed_lessons": ["tuning files are cheap"],
}

_COMMON = """#!{python}
import json, os, pathlib, sys
MODE = json.loads({mode!r})
home = pathlib.Path(os.environ["HOME"])
prompt = sys.stdin.read()
report = {{
    "argv": sys.argv[1:],
    "prompt": prompt,
    "cwd": os.getcwd(),
    "env_names": sorted(os.environ),
    "key_ok": {{name: os.environ.get(name) == value for name, value in MODE["keys"].items()}},
}}
(home / "standin-report.json").write_text(json.dumps(report))
pathlib.Path("probe").mkdir(exist_ok=True)
pathlib.Path("probe/tuning.py").write_text("TUNED = True\\n")
if MODE.get("proposal_file"):
    pathlib.Path(os.environ["AUTOPILOT_PROPOSAL"]).write_text(json.dumps(MODE["proposal_file"]))
message = MODE["message"]
def emit(event):
    print(json.dumps(event), flush=True)
print("a line on stderr that is not an event", file=sys.stderr, flush=True)
"""

# Claude Code `-p --output-format stream-json --verbose`: an init system message, the
# assistant's messages, then the result message (SDKResultMessage).
_CLAUDE = """
emit({"type": "system", "subtype": "init", "session_id": "s-1", "tools": ["Read", "Edit"]})
emit({"type": "assistant", "session_id": "s-1", "parent_tool_use_id": None,
      "message": {"role": "assistant", "content": [{"type": "text", "text": message}]}})
emit({"type": "result", "subtype": MODE.get("subtype", "success"),
      "is_error": MODE.get("subtype", "success") != "success", "duration_ms": 1200,
      "duration_api_ms": 1000, "num_turns": 3, "result": message, "session_id": "s-1",
      "total_cost_usd": 0.0123,
      "usage": {"input_tokens": 100, "cache_creation_input_tokens": 20,
                "cache_read_input_tokens": 300, "output_tokens": 50},
      "permission_denials": []})
sys.exit(MODE.get("exit", 0))
"""

# Codex `exec --json`: thread and turn events, items, the agent's message last, then the
# turn's usage; `-o FILE` gets the last message.
_CODEX = """
emit({"type": "thread.started", "thread_id": "t-1"})
emit({"type": "turn.started"})
emit({"type": "item.completed", "item": {"id": "item_0", "type": "reasoning",
      "text": "**Editing the probe**"}})
emit({"type": "item.completed", "item": {"id": "item_1", "type": "file_change",
      "changes": [{"path": "probe/tuning.py", "kind": "add"}], "status": "completed"}})
emit({"type": "item.completed", "item": {"id": "item_2", "type": "agent_message",
      "text": message}})
emit({"type": "turn.completed",
      "usage": {"input_tokens": 1000, "cached_input_tokens": 600, "output_tokens": 70}})
args = sys.argv[1:]
if MODE.get("write_last", True) and "--output-last-message" in args:
    pathlib.Path(args[args.index("--output-last-message") + 1]).write_text(message)
sys.exit(MODE.get("exit", 0))
"""


def fenced(proposal: dict[str, Any]) -> str:
    """A final message as a model writes it: prose, then the proposal in a ```json block."""
    return (
        "I added probe/tuning.py. Here is the proposal:\n\n```json\n"
        + json.dumps(proposal, indent=2)
        + "\n```\n"
    )


def install(
    bin_dir: Path,
    name: str,
    *,
    message: str,
    keys: dict[str, str] | None = None,
    **mode: Any,
) -> Path:
    """Write the stand-in `name` ("claude" or "codex") into `bin_dir`; `keys` are the variables
    (and values) it checks it received."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    body = {"claude": _CLAUDE, "codex": _CODEX}[name]
    mode = {**mode, "message": message, "keys": keys or {}}
    path = bin_dir / name
    path.write_text(_COMMON.format(python=PYTHON, mode=json.dumps(mode)) + body)
    path.chmod(0o755)
    return path


def report(files: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((files / "standin-report.json").read_text())
    return data


def path_with(bin_dir: Path) -> str:
    return f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
