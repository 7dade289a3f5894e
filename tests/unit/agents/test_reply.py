"""The LLM agent's reply parsing: the JSON object in a reply's text, the paths a diff names."""

from __future__ import annotations

import pytest

from app.agents.reply import Refused, first_object, numstat_paths, refuse_protected, renamed_from


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        '  {"a": 1}\n',
        'Sure! ```json\n{"a": 1}\n``` Anything else?',
        '```\n{"a": 1}\n```',
        'The proposal {"a": 1} is my answer {"b": 2}',
        'prose {not json} then {"a": 1}',
    ],
)
def test_the_first_object_is_found(text: str) -> None:
    assert first_object(text) == {"a": 1}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "the reply is empty"),
        ("[1, 2]", "must be a JSON object, not a JSON array"),
        ('"text"', "must be a JSON object, not a JSON string"),
        ("no braces at all", "the reply is not JSON (Expecting value"),
        ('{"a": 1', "holds no JSON object"),
    ],
)
def test_no_object_is_refused(text: str, error: str) -> None:
    with pytest.raises(Refused, match=None) as refused:
        first_object(text)
    assert error in str(refused.value)


def test_numstat_paths_read_renames_and_plain_changes() -> None:
    out = (
        b"1\t1\tprobe/tuning.py\x000\t0\t\x00probe/main.py\x00probe/moved.py\x00-\t-\tblob.bin\x00"
    )
    assert numstat_paths(out) == ["probe/tuning.py", "probe/main.py", "probe/moved.py", "blob.bin"]


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("probe/main.py", "protected path 'probe/main.py'"),
        ("secrets/a/b.txt", "protected path 'secrets/'"),
        ("autopilot.toml", "protected path 'autopilot.toml'"),
        ("./autopilot.toml", "protected path 'autopilot.toml'"),
        ("x/.git/config", "git's own files"),
        ("../outside.py", "outside the repository"),
        ("/etc/passwd", "outside the repository"),
    ],
)
def test_protected_paths_are_refused(path: str, error: str) -> None:
    with pytest.raises(Refused) as refused:
        refuse_protected([path], ["probe/main.py", "secrets/", "autopilot.toml"])
    assert error in str(refused.value)


def test_other_paths_pass() -> None:
    refuse_protected(
        ["probe/tuning.py", "probe/main.py.bak", "secretsmore/x"],
        ["probe/main.py", "secrets/", "autopilot.toml"],
    )


def test_renamed_from_reads_plain_and_quoted_names() -> None:
    diff = (
        "diff --git a/probe/main.py b/probe/moved.py\nsimilarity index 100%\n"
        "rename from probe/main.py\nrename to probe/moved.py\n"
        'diff --git "a/\\141 b.py" b/c.py\nrename from "\\141\\tb.py"\nrename to c.py\n'
        "diff --git a/x b/y\nrename old legacy.py\nrename new y\n"
        "+rename from not-a-header.py\n"
    )
    assert renamed_from(diff) == ["probe/main.py", "a\tb.py", "legacy.py"]
