"""The presets' pure parts: argv, the proposal in a final message, the events read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.agents import presets
from app.agents.exceptions import AgentFailed

PROPOSAL = {"hypothesis": "h", "experiment": "probe", "parameters": {"sleep_s": 0.2}}


def test_argv_appends_the_flags_to_a_given_program(tmp_path: Path) -> None:
    built = presets.argv(
        "claude-code", ["/opt/bin/claude", "--model", "opus"], max_turns=3, files=tmp_path
    )
    assert built[:4] == ["/opt/bin/claude", "--model", "opus", "-p"]
    assert built[built.index("--max-turns") + 1] == "3"
    assert presets.argv("codex", [], max_turns=3, files=tmp_path)[:2] == ["codex", "exec"]
    assert presets.argv("codex", [], max_turns=3, files=tmp_path)[-1] == "-"  # prompt on stdin
    with pytest.raises(AgentFailed, match="unknown agent preset"):
        presets.argv("aider", [], max_turns=3, files=tmp_path)


@pytest.mark.parametrize(
    "message",
    [
        "```json\n" + json.dumps(PROPOSAL) + "\n```",
        "Done.\n```\n" + json.dumps(PROPOSAL) + "\n```\nThanks.",
        # The last block that holds an object wins; a broken one is skipped.
        '```json\n{"hypothesis": "old"}\n```\n```json\n'
        + json.dumps(PROPOSAL)
        + "\n```\n```json\n{oops\n```",
        json.dumps(PROPOSAL),
        # Prose around a bare object, an unrelated object before it, braces inside strings.
        'I read {"a": 1} first. Proposal: '
        + json.dumps({**PROPOSAL, "what_changed": "a {b}"})
        + " ok",
    ],
)
def test_proposal_in_a_final_message(message: str) -> None:
    found = presets.proposal_json(message)
    assert {k: found[k] for k in PROPOSAL} == PROPOSAL


@pytest.mark.parametrize("message", [None, "", "  ", "no JSON at all", "a [list] only"])
def test_no_proposal_in_a_final_message(message: str | None) -> None:
    with pytest.raises(AgentFailed, match="final message"):
        presets.proposal_json(message)


def write_log(path: Path, *lines: object) -> None:
    with path.open("a") as log:
        for line in lines:
            log.write((line if isinstance(line, str) else json.dumps(line)) + "\n")


def test_only_what_the_run_printed_is_read(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    write_log(log, {"type": "result", "subtype": "success", "result": "an earlier run"})
    offset = log.stat().st_size
    write_log(log, "warning: not JSON", "{broken", {"type": "system", "subtype": "init"})
    found = presets.outcome("claude-code", log, offset, tmp_path)
    assert found.failure == "claude printed no final result event"
    write_log(
        log,
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "the answer",
            "total_cost_usd": 0.5,
            "usage": {"input_tokens": 1, "output_tokens": 2},
        },
    )
    found = presets.outcome("claude-code", log, offset, tmp_path)
    assert (found.message, found.tokens, found.cost_usd, found.failure) == (
        "the answer",
        3,
        0.5,
        None,
    )


def test_claude_error_result(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    result = {"type": "result", "subtype": "error_during_execution", "is_error": True}
    write_log(log, {**result, "num_turns": 2, "errors": ["API Error: 401"]})
    found = presets.outcome("claude-code", log, 0, tmp_path)
    assert (
        found.failure == "claude ended with 'error_during_execution' after 2 turns: API Error: 401"
    )


def test_codex_sums_its_turns_and_prefers_the_last_message_file(tmp_path: Path) -> None:
    log = tmp_path / "output.log"
    usage = {"input_tokens": 10, "cached_input_tokens": 4, "output_tokens": 1}
    message = {"type": "item.completed", "item": {"type": "agent_message", "text": "from events"}}
    write_log(log, message, {"type": "turn.completed", "usage": usage})
    write_log(log, {"type": "error", "message": "Reconnecting... 1/5"})
    write_log(log, {"type": "turn.completed", "usage": usage})
    found = presets.outcome("codex", log, 0, tmp_path)
    assert (found.message, found.tokens, found.failure) == ("from events", 22, None)
    (tmp_path / presets.LAST_MESSAGE).write_text("from the file")
    assert presets.outcome("codex", log, 0, tmp_path).message == "from the file"
    write_log(log, {"type": "turn.failed", "error": {"message": "quota exceeded"}})
    assert presets.outcome("codex", log, 0, tmp_path).failure == (
        "codex reported turn.failed: quota exceeded"
    )
