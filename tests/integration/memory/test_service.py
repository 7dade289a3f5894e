"""Research memory's service on SQLite and PostgreSQL: rules, audit, search, repeats, exchange."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from sqlalchemy import delete, func, inspect, select
from sqlalchemy.orm import Session

import app.memory
from app.db import Stores
from app.errors import InvalidInput
from app.memory import service
from app.memory.exceptions import CannotSupersede, FindingExists, InvalidImport
from app.memory.models import Finding, FindingEvent, MemoryBase
from app.memory.schemas import FindingCreate
from app.statemachine import IllegalMove
from tests.integration.memory.conftest import record, validated


def count(session: Session, *where: object) -> int:
    return session.scalar(select(func.count()).select_from(Finding).where(*where)) or 0  # type: ignore[arg-type]


# --- import ----------------------------------------------------------------------------------


def test_sample_import_gives_the_issue_figures(memory: Session, sample_bytes: bytes) -> None:
    report = service.import_file(memory, sample_bytes)
    assert report.model_dump() == {
        "format": "property-export",
        "imported": 10,
        "duplicates": 0,
        "by_project": {"attention-kernel-lab": 3, "null": 4, "quant-serving": 3},
        "truncated": 1,
    }
    assert count(memory) == 10
    assert count(memory, Finding.project == "attention-kernel-lab") == 3
    assert count(memory, Finding.project == "quant-serving") == 3
    assert count(memory, Finding.project.is_(None)) == 4
    assert count(memory, Finding.language == "ko") == 1
    assert count(memory, Finding.truncated.is_(True)) == 1
    assert (
        count(
            memory,
            Finding.truncated.is_(True),
            Finding.source_status == "unverified",
            Finding.publication_status == "unverified",
        )
        == 1
    )
    assert count(memory, Finding.kind == "lesson", Finding.status == "proposed") == 10
    korean = memory.scalars(select(Finding).where(Finding.language == "ko")).one()
    assert korean.statement.encode("utf-8") == (
        "측정 전에 GPU 클럭을 고정하지 않았다면 결과를 장치 간에 비교하지 않는다.".encode()
    )


def test_reimport_adds_nothing(memory: Session, sample_bytes: bytes) -> None:
    service.import_file(memory, sample_bytes)
    again = service.import_file(memory, sample_bytes)
    assert (again.imported, again.duplicates, again.by_project) == (0, 10, {})
    assert count(memory) == 10
    events = memory.scalar(select(func.count()).select_from(FindingEvent))
    assert events == 10


def test_import_commits_all_or_nothing(stores: Stores) -> None:
    lines = [json.dumps({"kind": "lesson", "statement": f"lesson {i}"}) for i in range(5)]
    lines.append(json.dumps({"kind": "lesson", "statement": "bad", "status": "approved"}))
    with pytest.raises(InvalidImport, match=r"line 6: status"), stores.memory_session() as s:
        service.import_file(s, "\n".join(lines).encode())
    # An error after rows were flushed (an unknown `supersedes`) rolls back the whole import.
    lines[-1] = json.dumps({"kind": "lesson", "statement": "late", "supersedes": "f" * 32})
    with pytest.raises(InvalidImport, match="line 6: supersedes"), stores.memory_session() as s:
        service.import_file(s, "\n".join(lines).encode())
    with stores.memory_session() as session:
        assert count(session) == 0


def test_validated_property_import_records_who(memory: Session, sample_bytes: bytes) -> None:
    service.import_file(memory, sample_bytes, status="validated", actor="t-admin")
    rows = memory.scalars(select(Finding)).all()
    assert {(r.status, r.validated_by) for r in rows} == {("validated", "t-admin")}
    assert all(r.validated_at is not None for r in rows)


@pytest.mark.parametrize(
    ("data", "fmt", "message"),
    [
        (b"", "auto", "empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "auto", "binary"),
        (b'{"kind": "lesson", "statement": "caf\xe9"}', "auto", "line 1: not valid UTF-8"),
        (b"hello world\nsecond line", "auto", "line 1: cannot tell the format"),
        (b'{"kind": "lesson"}\n', "jsonl", "line 1: statement"),
        (b"Property:x\nabout\n", "property-export", "no findings"),
    ],
)
def test_bad_files_are_named_and_store_nothing(
    stores: Stores, data: bytes, fmt: str, message: str
) -> None:
    with pytest.raises(InvalidInput) as caught, stores.memory_session() as session:
        service.import_file(session, data, format=fmt)  # type: ignore[arg-type]
    assert message in caught.value.detail
    with stores.memory_session() as session:
        assert count(session) == 0


def test_jsonl_round_trip_is_lossless(stores: Stores, sample_bytes: bytes) -> None:
    with stores.memory_session() as session:
        service.import_file(session, sample_bytes)
        verdict = record(
            session,
            "tile 128 wins by 4% ± 1%",
            kind="verdict",
            project="attention-kernel-lab",
            hypothesis="larger tiles cut HBM traffic",
            device_kind="h100",
            fingerprint=service.fingerprint("attention-kernel-lab", "tile", {"tile": 128}, "h100"),
            scope={"shapes": [[4096, 4096]], "torch": "2.13"},
            metrics={"speedup": 1.04, "n": 30},
            source="https://example.org/run/7",
            source_status="verified",
            evidence={
                "cycle_id": "42",
                "commit": "abc123",
                "pr_url": "https://f/pr/9",
                "result_path": "runs/42/result.json",
            },
            tags=["tiling", "타일"],
        )
        service.validate(session, verdict.id, "reviewer", "looks right")
        service.supersede(
            session,
            verdict.id,
            FindingCreate(
                kind="verdict", project="attention-kernel-lab", statement="tile 128 wins by 3%"
            ),
            "reviewer",
            "re-measured",
        )
        first = service.export(session, "jsonl")
    with stores.memory_session() as session:
        session.execute(delete(FindingEvent))
        session.execute(delete(Finding).where(Finding.supersedes.is_not(None)))
        session.execute(delete(Finding))
    with stores.memory_session() as session:
        report = service.import_file(session, first.encode())
        assert (report.format, report.imported, report.duplicates) == ("jsonl", 12, 0)
    with stores.memory_session() as session:
        assert service.export(session, "jsonl") == first
        again = service.import_file(session, first.encode())
        assert (again.imported, again.duplicates) == (0, 12)
    lines = [json.loads(line) for line in first.splitlines()]
    old = next(line for line in lines if line["id"] == verdict.id)
    assert old["status"] == "superseded"
    assert [e["to_status"] for e in old["events"]] == ["proposed", "validated", "superseded"]


def test_markdown_export_groups_and_imports_back(stores: Stores, sample_bytes: bytes) -> None:
    with stores.memory_session() as session:
        service.import_file(session, sample_bytes)
        text = service.export(session, "markdown")
    assert text.index("## Project: attention-kernel-lab") < text.index("## Project: quant-serving")
    assert text.index("## Project: quant-serving") < text.index("## General (no project)")
    assert text.count("### lesson") == 3
    assert text.count("· unverified") == 10 and text.count("· truncated") == 1
    with stores.memory_session() as session:
        session.execute(delete(FindingEvent))
        session.execute(delete(Finding))
    with stores.memory_session() as session:
        report = service.import_file(session, text.encode())
        assert (report.format, report.imported, report.truncated) == ("markdown", 10, 1)
        assert report.by_project == {"attention-kernel-lab": 3, "null": 4, "quant-serving": 3}
        assert service.import_file(session, sample_bytes).duplicates == 10


# --- status rules and audit --------------------------------------------------------------------


def test_status_rules_and_audit_trail(memory: Session) -> None:
    kept = record(memory, "Lock clocks before timing.", actor="t-trigger")
    dropped = record(memory, "Bigger batches always help.")
    service.validate(memory, kept.id, "t-review", "reproduced twice")
    service.refute(memory, dropped.id, "t-review", "slower past batch 64 on h100")
    assert (kept.status, kept.validated_by) == ("validated", "t-review")
    assert kept.validated_at is not None and dropped.status == "refuted"

    for call in (
        lambda: service.validate(memory, kept.id, "x"),
        lambda: service.refute(memory, kept.id, "x", "changed my mind"),
        lambda: service.validate(memory, dropped.id, "x"),
        lambda: service.refute(memory, dropped.id, "x", "again"),
    ):
        with pytest.raises(IllegalMove) as caught:
            call()
        assert caught.value.status == 409 and caught.value.slug == "illegal-finding-move"
        assert caught.value.extra["from_state"] in ("validated", "refuted")
    with pytest.raises(InvalidInput, match="reason"):
        service.refute(memory, record(memory, "x y z").id, "x", "  ")

    trail = [
        (e.from_status, e.to_status, e.actor, e.reason) for e in service.history(memory, kept.id)
    ]
    assert trail == [
        (None, "proposed", "t-trigger", None),
        ("proposed", "validated", "t-review", "reproduced twice"),
    ]
    refuted = service.history(memory, dropped.id)[-1]
    assert (refuted.to_status, refuted.reason) == ("refuted", "slower past batch 64 on h100")


def test_validated_changes_only_by_supersession(memory: Session) -> None:
    old = validated(memory, "Tile 64 is best on h100.", project="kernel-lab")
    proposed = record(memory, "Probably tile 96.", project="kernel-lab")
    with pytest.raises(CannotSupersede, match="supersedes"):
        record(memory, "Tile 32?", project="kernel-lab", supersedes=proposed.id)

    # A proposal that supersedes takes effect only when it is validated.
    successor = record(
        memory, "Tile 128 is best on h100 since CUDA 13.", project="kernel-lab", supersedes=old.id
    )
    assert old.status == "validated"
    service.validate(memory, successor.id, "t-review")
    assert (old.status, successor.status) == ("superseded", "validated")
    assert [e.to_status for e in service.history(memory, old.id)] == [
        "proposed",
        "validated",
        "superseded",
    ]
    assert service.detail(memory, old.id).superseded_by == [successor.id]

    newer = service.supersede(
        memory,
        successor.id,
        FindingCreate(
            kind="lesson", project="kernel-lab", statement="Tile 128, unless head_dim > 128."
        ),
        "t-review",
        "new head sizes",
    )
    assert (newer.status, newer.supersedes, successor.status) == (
        "validated",
        successor.id,
        "superseded",
    )
    with pytest.raises(CannotSupersede, match="superseded"):
        service.supersede(memory, old.id, FindingCreate(kind="lesson", statement="again"), "t")


def test_same_content_twice_is_a_conflict(memory: Session) -> None:
    first = record(memory, "Warm up before timing.", project="kernel-lab")
    with pytest.raises(FindingExists) as caught:
        record(memory, "Warm up  before timing.\n", project="kernel-lab")
    assert caught.value.extra["finding_id"] == first.id
    assert record(memory, "Warm up before timing.", project="other-lab").id != first.id


def test_statement_is_stored_byte_exact(memory: Session) -> None:
    statement = "  Tabs\tand CRLF\r\nand é (e\u0301) stay  "
    finding = record(memory, statement)
    memory.expire_all()
    assert service.get(memory, finding.id).statement == statement


# --- no repeat -----------------------------------------------------------------------------------


def test_check_repeat_finds_the_judged_verdict_and_its_bounds(memory: Session) -> None:
    params = {"tile": 128, "stages": 3, "dtype": "bf16"}
    mark = service.fingerprint("kernel-lab", "flash-tile", params, "h100")
    assert service.check_repeat(memory, mark) is None
    verdict = record(
        memory,
        "Tile 128 with 3 stages: 4% faster.",
        kind="verdict",
        project="kernel-lab",
        fingerprint=mark,
        device_kind="h100",
    )
    assert service.check_repeat(memory, mark) is None  # proposed is not judged yet
    service.validate(memory, verdict.id, "t-review")
    bound = validated(
        memory,
        "Stages > 3 run out of shared memory on h100.",
        kind="bound",
        project="kernel-lab",
        fingerprint=mark,
        device_kind="h100",
    )
    record(memory, "An unjudged bound.", kind="bound", project="kernel-lab", fingerprint=mark)

    reordered = {"dtype": "bf16", "stages": 3.0, "tile": 128}
    repeat = service.check_repeat(
        memory, service.fingerprint("kernel-lab", "flash-tile", reordered, "h100")
    )
    assert repeat is not None
    assert repeat.verdict.id == verdict.id
    assert [b.id for b in repeat.bounds] == [bound.id]
    other_device = service.fingerprint("kernel-lab", "flash-tile", params, "a100")
    assert service.check_repeat(memory, other_device) is None

    refuted_mark = service.fingerprint("kernel-lab", "flash-tile", {"tile": 256}, "h100")
    wrong = record(
        memory, "Tile 256 wins.", kind="verdict", project="kernel-lab", fingerprint=refuted_mark
    )
    service.refute(memory, wrong.id, "t-review", "register spills")
    refuted = service.check_repeat(memory, refuted_mark)
    assert refuted is not None and refuted.verdict.status == "refuted"
    with pytest.raises(InvalidInput, match="fingerprint"):
        service.check_repeat(memory, "not-a-fingerprint")


# --- search ---------------------------------------------------------------------------------


def test_search_korean_and_english(memory: Session, sample_bytes: bytes) -> None:
    service.import_file(memory, sample_bytes)
    for query in ("클럭", "결과를 장치", "GPU 클럭", "비교하지"):
        page = service.search(memory, query)
        assert [f.language for f in page.items] == ["ko"], query
    page = service.search(memory, "TILE size")
    assert [f.project for f in page.items] == ["attention-kernel-lab"]
    assert page.items[0].statement.startswith("A tile size that wins")
    assert service.search(memory, "calibration").items[0].project == "quant-serving"
    assert service.search(memory, "int8 per-tensor").items == []
    assert service.search(memory, '"; DROP TABLE finding; --').items == []
    assert service.search(memory, "100%").items == []


def test_search_filters_rank_and_pages(memory: Session) -> None:
    for i in range(5):
        record(memory, f"kernel timing note {i}", project="kernel-lab", device_kind="h100")
    record(memory, "kernel timing kernel timing, twice", project="kernel-lab", device_kind="a100")
    record(memory, "kernel timing elsewhere", project="other-lab")
    validated(memory, "kernel timing validated", project="kernel-lab", kind="policy")

    assert len(service.search(memory, "kernel timing").items) == 8
    assert len(service.search(memory, "kernel timing", project="kernel-lab").items) == 7
    assert len(service.search(memory, "timing", device_kind="h100").items) == 5
    only = service.search(memory, "timing", kind="policy", status="validated").items
    assert [f.statement for f in only] == ["kernel timing validated"]

    first = service.search(memory, "kernel", limit=3)
    assert (len(first.items), first.next_offset) == (3, 3)
    rest = service.search(memory, "kernel", limit=3, offset=6)
    assert (len(rest.items), rest.next_offset) == (2, None)
    seen = {
        f.id
        for off in (0, 3, 6)
        for f in service.search(memory, "kernel", limit=3, offset=off).items
    }
    assert len(seen) == 8
    with pytest.raises(InvalidInput, match="kind"):
        service.search(memory, "x", kind="rumour")
    with pytest.raises(InvalidInput, match="limit"):
        service.search(memory, "x", limit=0)


def test_related_gives_validated_findings_of_the_project_and_general(memory: Session) -> None:
    bound = validated(
        memory, "Shared memory caps stages at 3 on h100.", kind="bound", project="kernel-lab"
    )
    lesson = validated(memory, "Calibrate int8 scales on real traffic.", project="quant-serving")
    general = validated(memory, "Lock GPU clocks before timing anything.")
    record(memory, "Stages and shared memory: unreviewed idea.", project="kernel-lab")
    found = service.related(
        memory, "kernel-lab", "How many pipeline stages fit in shared memory?", 2
    )
    assert [f.id for f in found] == [bound.id, general.id]
    assert lesson.id not in {f.id for f in service.related(memory, "kernel-lab", "int8 scales", 5)}
    assert [f.id for f in service.related(memory, None, "clocks timing", 1)] == [general.id]


# --- separation ------------------------------------------------------------------------------


def test_memory_lives_apart_from_ops(stores: Stores) -> None:
    memory_tables = set(inspect(stores.memory_engine).get_table_names())
    ops_tables = set(inspect(stores.ops_engine).get_table_names())
    assert {"finding", "finding_event"} <= memory_tables
    assert not ({"finding", "finding_event"} & ops_tables)
    for table in MemoryBase.metadata.tables.values():
        assert all(fk.column.table.name in MemoryBase.metadata.tables for fk in table.foreign_keys)
    package = Path(app.memory.__file__).parent
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith(
                    ("app.projects", "app.jobs", "app.cycles", "workers")
                ), source
