"""What the LLM agent accepts back: the proposal as a JSON object in the reply's text, and the
paths its diff touches checked against the protected ones. Every refusal is a `Refused` whose
message goes back to the model word for word."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from app.agents.prompt import DIFF_KEY, REQUIRED_KEYS
from app.agents.service import Proposal

_FENCE = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\r?\n(.*?)```", re.DOTALL)
_STRINGS = ("hypothesis", "experiment", "what_changed", "expected_outcome")


class Refused(Exception):
    """A reply the model may correct: the message says exactly what was wrong."""


@dataclass
class Candidate:
    proposal: Proposal
    diff: str | None


def first_object(content: str) -> dict[str, Any]:
    """The reply's JSON object: the whole text, else the first ``` fence that holds one, else
    the first `{...}` in the text that decodes as an object."""
    text = content.strip()
    if not text:
        raise Refused("the reply is empty; send the proposal as one JSON object")
    try:
        whole = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:  # nesting past the parser's depth
        whole, error = None, exc
    else:
        if isinstance(whole, dict):
            return whole
        raise Refused(f"the reply must be a JSON object, not a JSON {_kind(whole)}")
    decoder = json.JSONDecoder()
    for block in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        start = block.find("{")
        while start != -1:
            try:
                found, _ = decoder.raw_decode(block, start)
            except (json.JSONDecodeError, RecursionError):
                found = None
            if isinstance(found, dict):
                return found
            start = block.find("{", start + 1)
    raise Refused(f"the reply is not JSON ({error}) and holds no JSON object")


def candidate(data: dict[str, Any], *, diff_allowed: bool) -> Candidate:
    """The proposal a reply's object states, or `Refused` naming the first key that is wrong."""
    allowed = (*REQUIRED_KEYS, DIFF_KEY)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise Refused(f"unknown key {unknown[0]!r}; the keys are: {', '.join(allowed)}")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise Refused(f"missing key {missing[0]!r}; every reply has: {', '.join(REQUIRED_KEYS)}")
    for key in _STRINGS:
        if not isinstance(data[key], str):
            raise Refused(f"{key!r} must be a string, not a JSON {_kind(data[key])}")
    if not isinstance(data["parameters"], dict):
        raise Refused(f"'parameters' must be an object, not a JSON {_kind(data['parameters'])}")
    lessons = data["proposed_lessons"]
    if not isinstance(lessons, list) or not all(isinstance(x, str) for x in lessons):
        raise Refused("'proposed_lessons' must be a list of strings")
    diff = data.get(DIFF_KEY)
    if diff is not None and not isinstance(diff, str):
        raise Refused(f"'diff' must be a string or null, not a JSON {_kind(diff)}")
    if diff is not None and not diff.strip():
        diff = None
    if diff is not None and not diff_allowed:
        raise Refused("this cycle takes no code change: set 'diff' to null")
    proposal = Proposal(
        hypothesis=data["hypothesis"],
        experiment=data["experiment"],
        parameters=dict(data["parameters"]),
        changes=data["what_changed"],
        expected=data["expected_outcome"],
        lessons=list(lessons),
    )
    return Candidate(proposal, diff if diff is None or diff.endswith("\n") else diff + "\n")


def numstat_paths(output: bytes) -> list[str]:
    """The paths `git apply --numstat -z` names: `added\\tdeleted\\tpath\\0`, or for a rename
    or copy `added\\tdeleted\\t\\0old\\0new\\0`."""
    fields = output.split(b"\0")
    paths: list[str] = []
    i = 0
    while i < len(fields):
        field = fields[i]
        i += 1
        if not field.strip():
            continue
        stat = field.split(b"\t", 2)
        if len(stat) != 3:
            raise Refused(f"git apply --numstat printed an unexpected line: {field[:200]!r}")
        if stat[2]:
            paths.append(stat[2].decode(errors="replace"))
        else:  # a rename or a copy: the two paths follow
            paths += [f.decode(errors="replace") for f in fields[i : i + 2]]
            i += 2
    return paths


def renamed_from(diff: str) -> list[str]:
    """The old paths of the diff's renames (`rename from` / `rename old` header lines), which
    `git apply --numstat` does not name: git lists only the new path of a rename."""
    found = []
    for line in diff.splitlines():
        for prefix in ("rename from ", "rename old "):
            if line.startswith(prefix):
                found.append(_unquote(line[len(prefix) :].rstrip()))
    return found


def _unquote(name: str) -> str:
    """A path as git writes it in a header: as is, or C-quoted ("a\\tb", octal bytes)."""
    if not (len(name) >= 2 and name.startswith('"') and name.endswith('"')):
        return name
    out, i, body = bytearray(), 0, name[1:-1]
    simple = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            if body[i + 1 : i + 4].isdigit():
                out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
                i += 4
                continue
        out += ch.encode()
        i += 1
    return out.decode(errors="replace")


def refuse_protected(paths: list[str], protected: list[str]) -> None:
    """`Refused` when a diff touches a protected path (or a folder's content), git's own
    files, or a path outside the repository."""
    for path in paths:
        parts = path.split("/")
        if path.startswith("/") or ".." in parts:
            raise Refused(f"the diff touches {path!r}, outside the repository")
        if ".git" in parts:
            raise Refused(f"the diff touches {path!r}: git's own files are never edited")
        norm = posixpath.normpath(path)
        for guarded in protected:
            root = posixpath.normpath(guarded)
            if norm == root or norm.startswith(root.rstrip("/") + "/"):
                raise Refused(
                    f"the diff touches the protected path {guarded!r} ({path}); protected: "
                    f"{', '.join(protected)}. Change other files, or send no diff"
                )


def _kind(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")
