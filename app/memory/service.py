"""Research memory's operations: record and judge findings, search, no-repeat checks, exchange.

Status rules are `lifecycle.py`'s: a finding is recorded `proposed`; only a proposed finding is
validated or refuted; a validated finding changes only by being superseded, when a new finding
that names it in `supersedes` is validated. Every status change is written to `finding_event`.
Callers own the transaction: these functions only flush.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import unicodedata
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, get_args

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.clock import utcnow
from app.errors import InvalidInput
from app.memory import exchange, repository
from app.memory import search_repository as search_index
from app.memory.exceptions import CannotSupersede, FindingExists, FindingNotFound, InvalidImport
from app.memory.lifecycle import FINDING
from app.memory.models import Finding, FindingEvent
from app.memory.schemas import (
    EventOut,
    ExportFormat,
    FindingCreate,
    FindingDetail,
    FindingOut,
    FindingRecord,
    ImportFormat,
    ImportReport,
    ImportStatus,
    Kind,
    SearchPage,
    Status,
    record_of,
)

MAX_PAGE = 100
MAX_OFFSET = 10_000
MAX_RELATED = 50
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


# --- identity ------------------------------------------------------------------------------


def normalise_statement(statement: str) -> str:
    """What makes two statements the same finding: NFC, whitespace runs collapsed."""
    return " ".join(unicodedata.normalize("NFC", statement).split())


def content_hash(project: str | None, kind: str, statement: str) -> str:
    """sha256 of the normalised identity (project, kind, statement): the import dedup key."""
    identity = json.dumps(
        [project, kind, normalise_statement(statement)], ensure_ascii=False, separators=(",", ":")
    )
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()


def detect_language(text: str) -> str:
    """A script-based guess: 'ko', 'ja', 'zh', 'en', or 'und' when there are no letters."""
    if any("\uac00" <= c <= "\ud7a3" or "\u1100" <= c <= "\u11ff" for c in text):
        return "ko"
    if any("\u3040" <= c <= "\u30ff" for c in text):
        return "ja"
    if any("\u4e00" <= c <= "\u9fff" for c in text):
        return "zh"
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return "und"
    return "en" if sum(c.isascii() for c in letters) * 2 > len(letters) else "und"


def _canonical(value: Any, path: str) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return unicodedata.normalize("NFC", value)
    if isinstance(value, int):
        return value
    if isinstance(value, float | Decimal):
        number = float(value)
        if not math.isfinite(number):
            raise InvalidInput(f"{path}: {value!r} is not a finite number", field=path)
        # 2, 2.0 and Decimal('2.00') are one value; -0.0 is 0.
        return int(number) if number.is_integer() else number
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInput(f"{path}: key {key!r} is not a string", field=path)
            out[unicodedata.normalize("NFC", key)] = _canonical(item, f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [_canonical(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise InvalidInput(
        f"{path}: a {type(value).__name__} cannot be part of a fingerprint; use JSON values",
        field=path,
    )


def fingerprint(
    project: str | None,
    experiment: str,
    parameters: Mapping[str, Any],
    device_kind: str,
    change: str | None = None,
) -> str:
    """The canonical fingerprint of a hypothesis test: sha256 (hex) of sorted-key JSON.

    Key order and number spelling (2 / 2.0) do not change it; the device kind does. `change`
    names a code change (`GitWork.change_id`: the base's tree and the candidate's): the same
    change at the same point on the same base is a repeat, another change is a new hypothesis.
    Without one the fingerprint is what it was before changes were part of it.
    """
    if not experiment.strip():
        raise InvalidInput("experiment: must not be blank", field="experiment")
    if not device_kind.strip():
        raise InvalidInput("device_kind: must not be blank", field="device_kind")
    canonical = json.dumps(
        {
            "project": project,
            "experiment": experiment,
            "parameters": _canonical(dict(parameters), "parameters"),
            "device_kind": device_kind,
            **({"change": change} if change else {}),
        },
        sort_keys=True,
        ensure_ascii=False,
        separators=(",", ":"),
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


# --- reading -------------------------------------------------------------------------------


def get(session: Session, finding_id: str, *, for_update: bool = False) -> Finding:
    finding = repository.get(session, finding_id, for_update=for_update)
    if finding is None:
        raise FindingNotFound(
            f"no finding {finding_id!r}; search with GET /api/v1/memory/findings",
            finding_id=finding_id,
        )
    return finding


def history(session: Session, finding_id: str) -> Sequence[FindingEvent]:
    """The finding's audit trail, oldest first."""
    get(session, finding_id)
    return repository.events(session, finding_id)


def detail(session: Session, finding_id: str) -> FindingDetail:
    finding = get(session, finding_id)
    return FindingDetail(
        **FindingOut.from_model(finding).model_dump(),
        events=[EventOut.from_model(e) for e in repository.events(session, finding_id)],
        superseded_by=repository.superseded_by(session, finding_id),
    )


# --- recording and judging -----------------------------------------------------------------


def _event(
    finding_id: str, before: str | None, after: str, actor: str, reason: str | None
) -> FindingEvent:
    return FindingEvent(
        finding_id=finding_id,
        from_status=before,
        to_status=after,
        actor=actor[:64],
        reason=reason,
        at=utcnow(),
    )


def _row(data: FindingCreate, digest: str, status: str, finding_id: str | None = None) -> Finding:
    return Finding(
        id=finding_id or uuid.uuid4().hex,
        project=data.project,
        kind=data.kind,
        statement=data.statement,
        language=data.language or detect_language(data.statement),
        content_hash=digest,
        hypothesis=data.hypothesis,
        fingerprint=data.fingerprint,
        device_kind=data.device_kind,
        scope=data.scope,
        metrics=data.metrics,
        status=status,
        source=data.source,
        source_status=data.source_status,
        publication_status=data.publication_status,
        truncated=data.truncated,
        group_name=data.group,
        tags=data.tags,
        cycle_id=data.evidence.cycle_id,
        commit_sha=data.evidence.commit,
        pr_url=data.evidence.pr_url,
        result_path=data.evidence.result_path,
        created_at=utcnow(),
    )


def _supersede_target(session: Session, finding_id: str) -> Finding:
    target = get(session, finding_id, for_update=True)
    if not FINDING.allows(target.status, "superseded"):
        raise CannotSupersede(
            f"supersedes: finding {finding_id} is {target.status}; only a validated finding "
            "can be superseded",
            field="supersedes",
        )
    return target


def create(session: Session, data: FindingCreate, actor: str) -> Finding:
    """Record a new finding as `proposed`. The same (project, kind, statement) twice: 409."""
    digest = content_hash(data.project, data.kind, data.statement)
    existing = repository.get_by_hash(session, digest)
    if existing is not None:
        raise FindingExists(
            f"this finding is already recorded as {existing.id} ({existing.status})",
            finding_id=existing.id,
        )
    if data.supersedes is not None:
        _supersede_target(session, data.supersedes)
    finding = _row(data, digest, "proposed")
    finding.supersedes = data.supersedes
    try:
        with session.begin_nested():
            repository.add(session, [finding])
            repository.add(session, [_event(finding.id, None, "proposed", actor, None)])
    except IntegrityError:  # a concurrent create of the same content won
        raise FindingExists("this finding was recorded at the same moment; look it up") from None
    return finding


def _transition(
    session: Session, finding: Finding, to: Status, actor: str, reason: str | None, **fields: Any
) -> None:
    """Move `finding` to `to` (`IllegalMove`, naming both statuses, where it may not), setting
    `fields` with it, and write the move to its audit trail."""
    before = finding.status
    FINDING.move(finding, to, **fields)
    repository.add(session, [_event(finding.id, before, to, actor, reason)])


def validate(session: Session, finding_id: str, actor: str, reason: str | None = None) -> Finding:
    """proposed -> validated; a finding that `supersedes` another supersedes it now."""
    finding = get(session, finding_id, for_update=True)
    target = _supersede_target(session, finding.supersedes) if finding.supersedes else None
    _transition(
        session,
        finding,
        "validated",
        actor,
        reason,
        validated_by=actor[:64],
        validated_at=utcnow(),
    )
    if target is not None:
        _transition(session, target, "superseded", actor, f"superseded by {finding.id}")
    repository.flush(session)
    return finding


def refute(session: Session, finding_id: str, actor: str, reason: str) -> Finding:
    """proposed -> refuted, with the reason kept in the audit trail."""
    if not reason.strip():
        raise InvalidInput("reason: say why the finding is refuted", field="reason")
    finding = get(session, finding_id, for_update=True)
    _transition(session, finding, "refuted", actor, reason)
    repository.flush(session)
    return finding


def supersede(
    session: Session, finding_id: str, data: FindingCreate, actor: str, reason: str | None = None
) -> Finding:
    """Replace validated finding `finding_id` with a new one, validated by `actor`; returns it."""
    if data.supersedes not in (None, finding_id):
        raise InvalidInput(
            f"supersedes: the new finding names {data.supersedes}, not {finding_id}",
            field="supersedes",
        )
    new = create(session, data.model_copy(update={"supersedes": finding_id}), actor)
    return validate(session, new.id, actor, reason)


# --- search --------------------------------------------------------------------------------


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> None:
    if value is not None and value not in allowed:
        raise InvalidInput(f"{name}: {value!r} is not one of {', '.join(allowed)}", field=name)


def search(
    session: Session,
    query: str = "",
    *,
    project: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    device_kind: str | None = None,
    limit: int = 20,
    offset: int = 0,
) -> SearchPage:
    """Findings holding every term of `query` (as substrings, any language), best first."""
    _choice("kind", kind, get_args(Kind))
    _choice("status", status, get_args(Status))
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidInput(f"limit: must be between 1 and {MAX_PAGE}", field="limit")
    if not 0 <= offset <= MAX_OFFSET:
        raise InvalidInput(f"offset: must be between 0 and {MAX_OFFSET}", field="offset")
    filters = search_index.Filters(project, kind, status, device_kind)
    rows = search_index.search(session, query, filters, limit + 1, offset)
    return SearchPage(
        items=[FindingOut.from_model(f) for f in rows[:limit]],
        limit=limit,
        offset=offset,
        next_offset=offset + limit if len(rows) > limit else None,
    )


def related(session: Session, project: str | None, text: str, k: int = 8) -> list[Finding]:
    """For the agent's prompt: the k validated findings and bounds most relevant to `text`,
    from `project` and the general ones; topped up with the project's newest when few match."""
    if not 1 <= k <= MAX_RELATED:
        raise InvalidInput(f"k: must be between 1 and {MAX_RELATED}", field="k")
    return search_index.related(session, project, text, k)


@dataclass(frozen=True)
class Repeat:
    """An earlier judgement of the same fingerprint, and the validated bounds it produced."""

    verdict: Finding
    bounds: list[Finding]


def check_repeat(session: Session, fingerprint: str) -> Repeat | None:
    """The newest validated or refuted verdict for `fingerprint`, or None if never judged."""
    if not _FINGERPRINT.fullmatch(fingerprint):
        raise InvalidInput(
            "fingerprint: expected 64 hex characters from memory.fingerprint()",
            field="fingerprint",
        )
    verdict = repository.latest_verdict(session, fingerprint)
    if verdict is None:
        return None
    return Repeat(verdict, list(repository.validated_bounds(session, fingerprint)))


# --- import and export ---------------------------------------------------------------------


def import_file(
    session: Session,
    data: bytes,
    *,
    format: ImportFormat = "auto",
    status: ImportStatus = "proposed",
    actor: str = "import",
) -> ImportReport:
    """Import every finding of a file, or none (bad input raises before anything is flushed
    for good: the caller rolls back). Findings already present, by content hash, are counted
    as duplicates and left as they are."""
    text = exchange.decode(data)
    fmt: ImportFormat = exchange.detect(text) if format == "auto" else format
    parsed = exchange.parse(text, fmt, status)
    digests = [content_hash(p.record.project, p.record.kind, p.record.statement) for p in parsed]
    known = repository.existing_hashes(session, digests)
    known_ids = repository.existing_ids(session, [p.record.id for p in parsed if p.record.id])
    fresh: list[tuple[exchange.Parsed, str]] = []
    seen, ids, duplicates = set(known), set(), 0
    for item, digest in zip(parsed, digests, strict=True):
        record_id = item.record.id
        if record_id and record_id in known_ids and known_ids[record_id] != digest:
            raise InvalidImport(
                f"line {item.line}: id {record_id} belongs to a different finding in memory",
                line=item.line,
                field="id",
            )
        if digest in seen:
            duplicates += 1
            continue
        if record_id and record_id in ids:
            raise InvalidImport(
                f"line {item.line}: id {record_id} appears twice with different content",
                line=item.line,
                field="id",
            )
        seen.add(digest)
        if record_id:
            ids.add(record_id)
        fresh.append((item, digest))

    targets = {p.record.supersedes for p, _ in fresh if p.record.supersedes} - ids
    present = set(repository.existing_ids(session, targets))
    rows: list[Finding] = []
    events: list[FindingEvent] = []
    links: list[tuple[Finding, str]] = []
    now = utcnow()
    for item, digest in fresh:
        record = item.record
        if record.supersedes and record.supersedes not in ids | present:
            raise InvalidImport(
                f"line {item.line}: supersedes {record.supersedes}, which is neither in memory "
                "nor in the file",
                line=item.line,
                field="supersedes",
            )
        row = _row(record, digest, record.status, record.id)
        row.created_at = record.created_at or now
        row.validated_by = record.validated_by
        row.validated_at = record.validated_at
        if record.status == "validated" and row.validated_by is None and fmt != "jsonl":
            row.validated_by, row.validated_at = actor[:64], now
        rows.append(row)
        if record.supersedes:
            links.append((row, record.supersedes))
        events.extend(_imported_events(row.id, record, actor, fmt, now))
    try:
        repository.add(session, rows)
        # Links last: a finding may supersede one that comes later in the file.
        for row, target in links:
            row.supersedes = target
        repository.add(session, events)
    except IntegrityError:
        raise FindingExists(
            "some of these findings were recorded at the same moment by another writer; "
            "run the import again (it skips what is already there)"
        ) from None
    by_project = Counter("null" if row.project is None else row.project for row in rows)
    return ImportReport(
        format=fmt,
        imported=len(rows),
        duplicates=duplicates,
        by_project=dict(sorted(by_project.items())),
        truncated=sum(row.truncated for row in rows),
    )


def _imported_events(
    finding_id: str, record: FindingRecord, actor: str, fmt: str, now: datetime
) -> list[FindingEvent]:
    if record.events:
        return [
            FindingEvent(
                finding_id=finding_id,
                from_status=e.from_status,
                to_status=e.to_status,
                actor=e.actor,
                reason=e.reason,
                at=e.at.astimezone(UTC),
            )
            for e in record.events
        ]
    return [_event(finding_id, None, record.status, actor, f"imported ({fmt})")]


def export(session: Session, format: ExportFormat = "jsonl") -> str:
    """Every finding: JSON Lines (lossless, audit trail included) or Markdown (for people)."""
    return "".join(export_chunks(session, format))


EXPORT_BATCH = 500


def export_chunks(session: Session, format: ExportFormat = "jsonl") -> Iterator[str]:
    """`export`, a finding at a time: the store is read `EXPORT_BATCH` findings (and their
    events) at a time, never whole, so an export of any size holds a batch in memory."""

    def records() -> Iterator[FindingRecord]:
        for batch in repository.findings_in_batches(session, EXPORT_BATCH):
            events = repository.events_by_finding(session, [f.id for f in batch])
            for finding in batch:
                yield record_of(finding, events[finding.id])

    if format == "markdown":
        yield from exchange.markdown_chunks(records())
        return
    for record in records():
        yield exchange.render_jsonl([record])
