"""Import and export formats without a database: the property export, Markdown, JSON Lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.memory import exchange
from app.memory.exceptions import ImportTooLarge, InvalidImport
from app.memory.schemas import FindingRecord

# A byte-exact copy of ../shared/examples/property-export-sample.txt (issue 5).
SAMPLE_TEXT = (Path(__file__).parent / "property-export-sample.txt").read_text(encoding="utf-8")


def parse_sample(status: str = "proposed") -> list[FindingRecord]:
    return [p.record for p in exchange.parse(SAMPLE_TEXT, "auto", status)]  # type: ignore[arg-type]


def test_sample_property_export_gives_the_issue_figures() -> None:
    records = parse_sample()
    assert len(records) == 10
    projects = [r.project for r in records]
    assert projects.count("attention-kernel-lab") == 3
    assert projects.count("quant-serving") == 3
    assert projects.count(None) == 4
    assert sum(1 for r in records if any("\uac00" <= c <= "\ud7a3" for c in r.statement)) == 1
    truncated = [r for r in records if r.truncated]
    assert len(truncated) == 1
    assert truncated[0].project == "quant-serving"
    assert truncated[0].statement.endswith("and the…")
    assert truncated[0].source_status == "unverified"
    assert truncated[0].publication_status == "unverified"


def test_sample_values_are_cleaned_but_never_filled_in() -> None:
    records = parse_sample()
    assert all(r.kind == "lesson" and r.status == "proposed" for r in records)
    assert all(r.source_status == "unverified" and r.source is None for r in records)
    assert all(not r.statement.endswith("+") for r in records)
    # The property name is a tag, never content; line 2 (the description) is no finding.
    assert all(r.tags == ["Reusable lesson"] for r in records)
    assert not any("교훈을 기록합니다" in r.statement for r in records)
    assert [r.group for r in records[:3]] == ["a", "a", "a"]
    assert {r.group for r in records[3:]} == {"b"}
    assert records[0].statement == (
        "Pin the data-loader worker count before comparing kernel timings; loader jitter hides "
        "differences under five percent."
    )
    assert (
        records[1].statement
        == "측정 전에 GPU 클럭을 고정하지 않았다면 결과를 장치 간에 비교하지 않는다."
    )


def test_concatenated_value_splits_in_order() -> None:
    value = (
        "attention-kernel-lab: When two tie, keep the simpler one. quant-serving: Calibrate on "
        "real traffic. attention-kernel-lab: Cache per device."
    )
    assert exchange.split_lessons(value) == [
        ("attention-kernel-lab", "When two tie, keep the simpler one."),
        ("quant-serving", "Calibrate on real traffic."),
        ("attention-kernel-lab", "Cache per device."),
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            "General first. lora-x: then a project.",
            [(None, "General first."), ("lora-x", "then a project.")],
        ),
        ("nohyphen: stays general", [(None, "nohyphen: stays general")]),
        ("a data-loader worker count", [(None, "a data-loader worker count")]),
        ("see http://x-y.org: not a slug", [(None, "see http://x-y.org: not a slug")]),
        ("word-slug:no space after colon", [(None, "word-slug:no space after colon")]),
    ],
)
def test_slug_rules(value: str, expected: list[tuple[str | None, str]]) -> None:
    assert exchange.split_lessons(value) == expected


def test_validated_only_when_the_import_says_so() -> None:
    assert {r.status for r in parse_sample("validated")} == {"validated"}


def test_english_property_word_and_crlf() -> None:
    text = "Property:Lessons\r\nWhat we learned.\r\nx\r\nkernel-lab: Time both passes. +\r\n"
    records = [p.record for p in exchange.parse(text, "auto")]
    assert [(r.project, r.statement, r.group) for r in records] == [
        ("kernel-lab", "Time both passes.", "x")
    ]


@given(st.text(alphabet=" \t+ab", max_size=12))
def test_the_continuation_mark_is_cut_as_the_regex_did(line: str) -> None:
    """Issue 20, item 10: the linear cut gives what `\\s+\\+$` gave, on any stripped line."""
    line = line.strip()
    assert exchange._without_continuation(line) == re.sub(r"\s+\+$", "", line)


def test_a_line_of_many_spaces_is_read_in_one_pass() -> None:
    text = "Property:Lessons\nabout\nkernel-lab: wide" + " " * 60_000 + "gap. +\n"
    (parsed,) = exchange.parse(text, "auto")
    assert parsed.record.statement.startswith("wide") and parsed.record.statement.endswith("gap.")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"  \n\n", "empty"),
        (b"Property:x\nabout\nline\x00with nul", "line 3: the file is binary"),
        (b"Property:x\nabout\n\xff\xfe broken", "line 3: not valid UTF-8"),
    ],
)
def test_bad_bytes_are_named(data: bytes, message: str) -> None:
    with pytest.raises(InvalidImport) as caught:
        exchange.decode(data)
    assert message in caught.value.detail
    assert caught.value.status == 422


def test_too_large_is_refused_before_decoding() -> None:
    with pytest.raises(ImportTooLarge) as caught:
        exchange.decode(b"x" * (exchange.MAX_IMPORT_BYTES + 1))
    assert caught.value.status == 413
    assert "50 MB" in caught.value.detail


def test_unknown_format_names_the_line() -> None:
    with pytest.raises(InvalidImport) as caught:
        exchange.detect("\n\njust some prose without a header\n")
    assert caught.value.detail.startswith("line 3: cannot tell the format")


def test_jsonl_errors_name_line_and_field() -> None:
    good = '{"kind": "lesson", "statement": "ok"}'
    with pytest.raises(InvalidImport) as caught:
        exchange.parse_jsonl(
            good + "\n" + '{"kind": "lesson", "statement": "x", "status": "maybe"}'
        )
    assert caught.value.detail.startswith("line 2: status:")
    assert caught.value.extra == {"line": 2, "field": "status"}
    with pytest.raises(InvalidImport, match="line 3: not valid JSON"):
        exchange.parse_jsonl(good + "\n\n{nope")
    with pytest.raises(InvalidImport, match="line 1: publication_status"):
        exchange.parse_jsonl(
            '{"kind": "lesson", "statement": "x", "publication_status": "verified"}'
        )


def test_markdown_round_trip_keeps_statement_bytes_and_marks() -> None:
    records = [
        FindingRecord(
            id="a1",
            project="kernel-lab",
            kind="bound",
            statement="  two\nlines, one  \n\nblank",
            status="validated",
            source_status="verified",
            source="https://example.org/paper",
            device_kind="h100",
        ),
        FindingRecord(id="b2", kind="lesson", statement="general; cut…", truncated=True, group="a"),
    ]
    text = exchange.render_markdown(records)
    assert "**validated** · verified · device `h100`" in text
    assert "**proposed** · unverified · truncated" in text
    back = [p.record for p in exchange.parse(text, "auto")]
    assert [
        (
            r.id,
            r.project,
            r.kind,
            r.statement,
            r.status,
            r.source_status,
            r.truncated,
            r.device_kind,
            r.source,
            r.group,
        )
        for r in back
    ] == [
        (
            r.id,
            r.project,
            r.kind,
            r.statement,
            r.status,
            r.source_status,
            r.truncated,
            r.device_kind,
            r.source,
            r.group,
        )
        for r in records
    ]


def test_markdown_rejects_what_our_exporter_never_writes() -> None:
    with pytest.raises(InvalidImport, match="line 3: expected '## Project"):
        exchange.parse_markdown("# Research memory\n\n## Somewhere else\n")
    with pytest.raises(InvalidImport, match="line 3: a finding before any"):
        exchange.parse_markdown("# Research memory\n\n- **proposed** · id `x`\n  > hi\n")
