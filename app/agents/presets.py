"""Coding-agent CLIs as command agents (`[agent] preset`): the argv each one needs to run
headless in the agent's sandbox, and its final message and token count read back from the
events it printed.

Formats, as their vendors document them:
- Claude Code, "Run Claude Code programmatically" (code.claude.com/docs/en/headless, formerly
  docs.anthropic.com/en/docs/claude-code/sdk/sdk-headless) and its CLI reference: `-p` runs one
  prompt non-interactively, read from stdin when no prompt argument is given;
  `--output-format stream-json` (which needs `--verbose` with `-p`) prints one JSON object a
  line, the last one `{"type": "result", "subtype": "success" | "error_max_turns" | ...,
  "is_error", "num_turns", "result", "total_cost_usd", "usage": {"input_tokens",
  "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"}, ...}` (the Agent
  SDK's SDKResultMessage); `--max-turns` caps the agentic turns; `--permission-mode
  acceptEdits` lets it edit files without a prompt nobody could answer; `--add-dir` gives it
  a directory beside its working directory (its files: context and proposal).
- OpenAI Codex CLI, "Non-interactive mode" (developers.openai.com/codex/noninteractive;
  openai/codex docs/exec.md) and `codex exec --help` (codex-rs/exec/src/cli.rs): the prompt is
  read from stdin when it is `-`; `--json` prints JSONL events (`thread.started`,
  `turn.started`, `item.completed` with `item.type == "agent_message"` and its `text`,
  `turn.completed` with `usage: {"input_tokens", "cached_input_tokens", "output_tokens"}`,
  `turn.failed`); `-o`/`--output-last-message FILE` writes the agent's last message to FILE;
  `--skip-git-repo-check` runs outside a trusted Git repository. `--sandbox
  danger-full-access`: its docs keep it for "a controlled environment (for example, an
  isolated CI runner or container)", which our sandbox is; Codex's own Linux sandbox
  (bubblewrap or Landlock) does not nest inside ours (openai/codex#23762, #17337), and its
  read-only default could not edit the clone.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.agents import workspace
from app.agents.exceptions import AgentFailed

#: The program each preset runs when `[agent] command` does not name one.
PROGRAMS: dict[str, list[str]] = {"claude-code": ["claude"], "codex": ["codex"]}
#: Where codex writes its last message (`--output-last-message`), in the agent's files dir.
LAST_MESSAGE = "last-message.md"
#: The most of its output we read back for its events (the end of it: the final event is last).
MAX_EVENTS_BYTES = 32 * 1024 * 1024

_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass
class Outcome:
    """What the CLI's events say of its run."""

    message: str | None = None  # its final message
    tokens: int | None = None  # tokens it reports (input, cached and output together)
    cost_usd: float | None = None
    failure: str | None = None  # why it stopped, when it says it failed


def argv(preset: str, command: list[str], *, max_turns: int, files: Path) -> list[str]:
    """The preset's argv; `command` (if set) replaces its program, e.g. ["/opt/bin/claude"]."""
    if preset not in PROGRAMS:
        raise AgentFailed(f"unknown agent preset {preset!r}; available: {', '.join(PROGRAMS)}")
    program = list(command) or PROGRAMS[preset]
    if preset == "claude-code":
        return [
            *program,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--max-turns",
            str(max_turns),
            "--permission-mode",
            "acceptEdits",
            "--add-dir",
            str(files),
        ]
    return [
        *program,
        "exec",
        "--json",
        "--sandbox",
        "danger-full-access",
        "--skip-git-repo-check",
        "--output-last-message",
        str(files / LAST_MESSAGE),
        "-",
    ]


def prompt_note(context_path: Path, proposal_path: Path) -> str:
    """What a preset's prompt adds: the paths (a CLI's model may not read its environment),
    and that its final message carries the proposal."""
    return (
        f"\nThe context JSON is the file {context_path}. Either write the proposal JSON to "
        f"{proposal_path}, or end with a final message that contains the proposal as one JSON "
        "object (a ```json fenced block is fine) with those keys; nothing else is read back.\n"
    )


def outcome(preset: str, log: Path, offset: int, files: Path) -> Outcome:
    """The CLI's final message and usage from what it printed after `offset` in `log`."""
    events = list(_events(log, offset))
    if preset == "claude-code":
        return _claude(events)
    found = _codex(events)
    written = workspace.read_plain_file(files / LAST_MESSAGE, workspace.MAX_PROPOSAL_BYTES)
    if written is not None and written.strip():
        found.message = written.decode("utf-8", errors="replace")
    return found


def _claude(events: list[dict[str, Any]]) -> Outcome:
    result = next((e for e in reversed(events) if e.get("type") == "result"), None)
    if result is None:
        return Outcome(failure="claude printed no final result event")
    usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
    keys = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    found = Outcome(
        message=result.get("result") if isinstance(result.get("result"), str) else None,
        tokens=_sum(usage, (*keys, "output_tokens")),
        cost_usd=_number(result.get("total_cost_usd")),
    )
    if result.get("subtype") != "success" or result.get("is_error") is True:
        errors = result.get("errors") if isinstance(result.get("errors"), list) else []
        why = "; ".join(str(e) for e in errors) or (found.message or "")
        found.failure = f"claude ended with {result.get('subtype')!r} after " + (
            f"{result.get('num_turns')} turns" + (f": {why[:500]}" if why else "")
        )
        if result.get("subtype") == "error_max_turns":
            found.failure += " (raise [agent] max_turns in autopilot.toml)"
    return found


def _codex(events: list[dict[str, Any]]) -> Outcome:
    found = Outcome()
    for event in events:
        kind, item = event.get("type"), event.get("item")
        if kind == "item.completed" and isinstance(item, dict):
            if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                found.message = item["text"]
        elif kind == "turn.completed" and isinstance(event.get("usage"), dict):
            # input_tokens already counts the cached ones (cached_input_tokens is a part).
            turn = _sum(event["usage"], ("input_tokens", "output_tokens"))
            if turn is not None:
                found.tokens = (found.tokens or 0) + turn
            found.failure = None
        elif kind in ("turn.failed", "error"):
            error = event.get("error")
            detail = error.get("message") if isinstance(error, dict) else event.get("message")
            found.failure = f"codex reported {kind}: {str(detail or '')[:500]}"
    return found


def proposal_json(message: str | None) -> dict[str, Any]:
    """The proposal object in an agent's final message: the last ```json block that holds a
    JSON object, else the last JSON object in the text that has a "hypothesis"."""
    if not message or not message.strip():
        raise AgentFailed("the agent wrote no proposal.json and its final message is empty")
    for block in reversed(_FENCE.findall(message)):
        try:
            parsed = json.loads(block)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(parsed, dict):
            return dict(parsed)
    objects = list(_objects(message))
    proposals = [candidate for candidate in objects if "hypothesis" in candidate] or objects
    if proposals:
        return proposals[-1]
    raise AgentFailed(
        "the agent wrote no proposal.json and its final message holds no JSON object; it "
        f"begins: {message.strip()[:200]!r}"
    )


def _objects(text: str) -> Iterator[dict[str, Any]]:
    decoder, at = json.JSONDecoder(), text.find("{")
    while at != -1:
        try:
            data, end = decoder.raw_decode(text, at)
        except (json.JSONDecodeError, RecursionError):
            at = text.find("{", at + 1)
            continue
        if isinstance(data, dict):
            yield data
        at = text.find("{", end)


def _events(log: Path, offset: int) -> Iterator[dict[str, Any]]:
    """The JSON objects printed one a line (stderr shares the log: other lines are skipped)."""
    try:
        fd = os.open(log, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    with os.fdopen(fd, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        handle.seek(max(offset, size - MAX_EVENTS_BYTES))
        data = handle.read(MAX_EVENTS_BYTES)
    for line in data.splitlines():
        line = line.strip()
        if not line.startswith(b"{"):
            continue
        try:
            event = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(event, dict):
            yield event


def _sum(usage: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    counts = [usage[k] for k in keys if isinstance(usage.get(k), int)]
    return sum(counts) if counts else None


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
