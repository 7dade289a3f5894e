"""Import and export formats of research memory: pure text in, records out (no database).

JSON Lines is our lossless format (one finding, with its audit trail, per line). Markdown is
for people, grouped by project then kind, and reads back what our exporter wrote. The
property export of note-taking databases is import only; its shape is `parse_property_export`'s
docstring.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.memory.exceptions import ImportTooLarge, InvalidImport
from app.memory.schemas import FindingRecord, ImportFormat, ImportStatus

MAX_IMPORT_BYTES = 50 * 1024 * 1024
MARKDOWN_TITLE = "# Research memory"
_GENERAL = "General (no project)"
_PROPERTY_HEADER = re.compile(r"(?P<word>[^\s:]+):(?P<name>\S.*)")
# A lesson inside a property value starts with a kebab-case project slug (one hyphen at
# least) and a colon, at the start of the value or after whitespace.
_SLUG_PREFIX = re.compile(r"(?:(?<=\s)|^)(?P<slug>[a-z0-9]+(?:-[a-z0-9]+)+): ")
_MD_ITEM = re.compile(r"- \*\*(?P<status>[a-z_]+)\*\*(?P<rest>.*)")
_MD_TICKED = re.compile(r"(?P<key>device|group|id) `(?P<value>[^`]*)`")


@dataclass(frozen=True)
class Parsed:
    """A record and the line of the file it starts on (for error messages)."""

    line: int
    record: FindingRecord


def decode(data: bytes) -> str:
    """The file as text, or a clear error: too large, empty, binary or not UTF-8."""
    if len(data) > MAX_IMPORT_BYTES:
        raise ImportTooLarge(
            f"the file is {len(data)} bytes; an import takes at most {MAX_IMPORT_BYTES} bytes "
            "(50 MB): split it into several files"
        )
    if not data.strip():
        raise InvalidImport("the file is empty: nothing to import", line=1)
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise InvalidImport(
            f"line {line}: the file is binary (it holds a NUL byte); expected UTF-8 text in "
            "JSON Lines, Markdown or property-export format",
            line=line,
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InvalidImport(
            f"line {line}: not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "save the file as UTF-8",
            line=line,
        ) from None
    return text.removeprefix("\ufeff")


def _lines(text: str) -> list[str]:
    return [line.removesuffix("\r") for line in text.split("\n")]


def detect(text: str) -> ImportFormat:
    """The format, told from the first non-empty line."""
    lines = _lines(text)
    number, first = next(((i, line) for i, line in enumerate(lines, 1) if line.strip()), (1, ""))
    if not first:
        raise InvalidImport("the file is empty: nothing to import", line=1)
    if first.lstrip().startswith("{"):
        return "jsonl"
    if first.strip() == MARKDOWN_TITLE:
        return "markdown"
    if number == 1 and _PROPERTY_HEADER.fullmatch(first.strip()):
        return "property-export"
    raise InvalidImport(
        f"line {number}: cannot tell the format from {first[:60]!r}; expected a JSON object "
        f"(JSON Lines), {MARKDOWN_TITLE!r} (Markdown) or '<word>:<property name>' (property "
        "export); or pass the format explicitly",
        line=number,
    )


def parse(text: str, fmt: ImportFormat, status: ImportStatus = "proposed") -> list[Parsed]:
    """Records of a decoded file. `status` applies to the property export, which has none."""
    if fmt == "auto":
        fmt = detect(text)
    if fmt == "jsonl":
        parsed = parse_jsonl(text)
    elif fmt == "markdown":
        parsed = parse_markdown(text)
    else:
        parsed = parse_property_export(text, status)
    if not parsed:
        raise InvalidImport(f"the file holds no findings in {fmt} format", line=1)
    return parsed


def _invalid_record(line: int, exc: ValidationError) -> InvalidImport:
    errors = exc.errors()
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"]) or first["msg"].split(":", 1)[0]
    messages = [
        (".".join(str(p) for p in e["loc"]) + ": " if e["loc"] else "")
        + e["msg"].removeprefix("Value error, ")
        for e in errors[:3]
    ]
    return InvalidImport(f"line {line}: {'; '.join(messages)}", line=line, field=field)


def _record(line: int, values: dict[str, Any]) -> Parsed:
    try:
        return Parsed(line, FindingRecord.model_validate(values))
    except ValidationError as exc:
        raise _invalid_record(line, exc) from None


def parse_jsonl(text: str) -> list[Parsed]:
    parsed = []
    for number, line in enumerate(_lines(text), 1):
        if not line.strip():
            continue
        try:
            values = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidImport(
                f"line {number}: not valid JSON ({exc.msg} at column {exc.colno})", line=number
            ) from None
        if not isinstance(values, dict):
            raise InvalidImport(f"line {number}: expected a JSON object", line=number)
        parsed.append(_record(number, values))
    return parsed


def split_lessons(value: str) -> list[tuple[str | None, str]]:
    """(project slug or None, lesson text) for each lesson concatenated in one value."""
    matches = list(_SLUG_PREFIX.finditer(value))
    head = value[: matches[0].start()] if matches else value
    lessons: list[tuple[str | None, str]] = []
    if head.strip():
        lessons.append((None, head.strip()))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(value)
        body = value[match.end() : end].strip()
        if body:
            lessons.append((match.group("slug"), body))
    return lessons


def parse_property_export(text: str, status: ImportStatus = "proposed") -> list[Parsed]:
    lines = _lines(text)
    header = _PROPERTY_HEADER.fullmatch(lines[0].strip())
    if header is None:
        raise InvalidImport(
            f"line 1: expected '<word>:<property name>' (e.g. 'Property:Lessons'), got "
            f"{lines[0][:60]!r}",
            line=1,
        )
    prop = header.group("name").strip()
    group: str | None = None
    parsed = []
    # Line 2 describes the property: it is read past, never turned into findings.
    for number, raw in enumerate(lines[2:], 3):
        line = raw.strip()
        if not line:
            continue
        if len(line) == 1 and line.isalpha():
            group = line
            continue
        value = _without_continuation(line)
        if value == "+":
            continue
        cut = value.endswith("…")
        lessons = split_lessons(value)
        for index, (project, statement) in enumerate(lessons):
            truncated = cut and index == len(lessons) - 1
            parsed.append(
                _record(
                    number,
                    {
                        "project": project,
                        "kind": "lesson",
                        "statement": statement,
                        "status": status,
                        # The file names no source: unverified, and a cut value stays so.
                        "source_status": "unverified",
                        "truncated": truncated,
                        "group": group,
                        "tags": [prop],
                    },
                )
            )
    return parsed


def parse_markdown(text: str) -> list[Parsed]:
    lines = _lines(text)
    start = next((i for i, line in enumerate(lines) if line.strip()), 0)
    if lines[start].strip() != MARKDOWN_TITLE:
        raise InvalidImport(
            f"line {start + 1}: expected {MARKDOWN_TITLE!r} (the Markdown our exporter writes)",
            line=start + 1,
        )
    project: str | None = None
    kind: str | None = None
    current: dict[str, Any] | None = None
    quote: list[str] = []
    parsed: list[Parsed] = []

    def close() -> None:
        nonlocal current
        if current is not None:
            if not quote:
                raise InvalidImport(
                    f"line {current['line']}: the finding has no '  > statement' lines",
                    line=current["line"],
                )
            values = {k: v for k, v in current.items() if k != "line"}
            parsed.append(_record(current["line"], {**values, "statement": "\n".join(quote)}))
        current = None
        quote.clear()

    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("  >") and current is not None:
            quote.append(line[4:] if line.startswith("  > ") else line[3:])
        elif line.startswith("  Source: ") and current is not None:
            current["source"] = line.removeprefix("  Source: ")
        elif not line.strip():
            continue
        elif line.startswith("## "):
            close()
            heading = line[3:].strip()
            if heading == _GENERAL:
                project = None
            elif heading.startswith("Project: "):
                project = heading.removeprefix("Project: ").strip()
            else:
                raise InvalidImport(
                    f"line {number}: expected '## Project: <slug>' or '## {_GENERAL}'",
                    line=number,
                )
            kind = None
        elif line.startswith("### "):
            close()
            kind = line[4:].strip()
        elif item := _MD_ITEM.fullmatch(line):
            close()
            if kind is None:
                raise InvalidImport(
                    f"line {number}: a finding before any '### <kind>' heading", line=number
                )
            current = {"line": number, "project": project, "kind": kind}
            current.update(_markdown_marks(item.group("status"), item.group("rest")))
        else:
            raise InvalidImport(
                f"line {number}: unexpected line {line[:60]!r} in Markdown", line=number
            )
    close()
    return parsed


def _markdown_marks(status: str, rest: str) -> dict[str, Any]:
    marks = [m.strip() for m in rest.split(" · ") if m.strip()]
    values: dict[str, Any] = {"status": status, "source_status": "verified"}
    for mark in marks:
        ticked = _MD_TICKED.fullmatch(mark)
        if ticked:
            key = {"device": "device_kind", "group": "group", "id": "id"}[ticked.group("key")]
            values[key] = ticked.group("value")
        elif mark == "unverified":
            values["source_status"] = "unverified"
        elif mark == "truncated":
            values["truncated"] = True
        elif mark.startswith("publication "):
            values["publication_status"] = mark.removeprefix("publication ")
    return values


def render_jsonl(records: Iterable[FindingRecord]) -> str:
    return "".join(
        json.dumps(r.model_dump(mode="json"), ensure_ascii=False, sort_keys=True) + "\n"
        for r in records
    )


def render_markdown(records: Iterable[FindingRecord]) -> str:
    """People's view: by project (general last), then kind; status and the unverified mark."""
    return "".join(markdown_chunks(records))


def markdown_chunks(records: Iterable[FindingRecord]) -> Iterator[str]:
    """`render_markdown` a finding at a time, for a streamed export."""
    yield MARKDOWN_TITLE + "\n"
    project: object = object()
    kind: str | None = None
    for record in records:
        out = [""]
        if record.project != project:
            project = record.project
            kind = None
            out += [f"## Project: {record.project}" if record.project else f"## {_GENERAL}", ""]
        if record.kind != kind:
            kind = record.kind
            out += [f"### {record.kind}", ""]
        marks = [f"**{record.status}**"]
        marks.append("unverified" if record.source_status == "unverified" else "verified")
        if record.source_status == "verified" and record.publication_status != "not_applicable":
            marks.append(f"publication {record.publication_status}")
        if record.truncated:
            marks.append("truncated")
        if record.device_kind:
            marks.append(f"device `{record.device_kind}`")
        if record.group:
            marks.append(f"group `{record.group}`")
        marks.append(f"id `{record.id}`")
        out += ["- " + " · ".join(marks), ""]
        out += [f"  > {line}" if line else "  >" for line in record.statement.split("\n")]
        if record.source:
            out.append(f"  Source: {record.source}")
        yield "\n".join(out) + "\n"


def _without_continuation(line: str) -> str:
    """The line without a trailing continuation mark (whitespace, then `+`). Linear: the regex
    `\\s+\\+$` it replaces backtracked over every start in a run of spaces (20,000 spaces:
    1.8 s)."""
    if not line.endswith("+"):
        return line
    body = line[:-1]
    kept = body.rstrip()
    return kept if len(kept) < len(body) else line
