"""All SQL of findings and their audit trail, except search (search.py). Only flushes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.memory.models import Finding, FindingEvent

_CHUNK = 500  # keeps IN lists well under SQLite's bound-parameter limit


def get(session: Session, finding_id: str, *, for_update: bool = False) -> Finding | None:
    query = select(Finding).where(Finding.id == finding_id)
    if for_update:
        query = query.with_for_update()
    return session.scalars(query).one_or_none()


def get_by_hash(session: Session, content_hash: str) -> Finding | None:
    return session.scalars(
        select(Finding).where(Finding.content_hash == content_hash)
    ).one_or_none()


def existing_hashes(session: Session, hashes: Iterable[str]) -> set[str]:
    wanted = list(hashes)
    found: set[str] = set()
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        found.update(
            session.scalars(select(Finding.content_hash).where(Finding.content_hash.in_(chunk)))
        )
    return found


def existing_ids(session: Session, ids: Iterable[str]) -> dict[str, str]:
    """id -> content hash of those ids that exist."""
    wanted = list(ids)
    found: dict[str, str] = {}
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        rows = session.execute(
            select(Finding.id, Finding.content_hash).where(Finding.id.in_(chunk))
        )
        found.update({row.id: row.content_hash for row in rows})
    return found


def superseded_by(session: Session, finding_id: str) -> list[str]:
    return list(
        session.scalars(
            select(Finding.id).where(Finding.supersedes == finding_id).order_by(Finding.created_at)
        )
    )


def latest_verdict(session: Session, fingerprint: str) -> Finding | None:
    return session.scalars(
        select(Finding)
        .where(
            Finding.fingerprint == fingerprint,
            Finding.kind == "verdict",
            Finding.status.in_(("validated", "refuted")),
        )
        .order_by(Finding.created_at.desc(), Finding.id)
        .limit(1)
    ).one_or_none()


def judged_verdicts(session: Session, project: str, limit: int) -> Sequence[Finding]:
    """The project's reviewed verdicts (validated or refuted), newest first."""
    return session.scalars(
        select(Finding)
        .where(
            Finding.project == project,
            Finding.kind == "verdict",
            Finding.status.in_(("validated", "refuted")),
        )
        .order_by(Finding.created_at.desc(), Finding.id)
        .limit(limit)
    ).all()


def judged_fingerprints(session: Session, project: str) -> set[str]:
    """The fingerprints of the project's reviewed verdicts (validated or refuted)."""
    rows = session.scalars(
        select(Finding.fingerprint).where(
            Finding.project == project,
            Finding.kind == "verdict",
            Finding.status.in_(("validated", "refuted")),
            Finding.fingerprint.is_not(None),
        )
    ).all()
    return {fp for fp in rows if fp}


def refuted(session: Session, project: str, limit: int) -> Sequence[Finding]:
    """The project's refuted findings, newest first."""
    return session.scalars(
        select(Finding)
        .where(Finding.project == project, Finding.status == "refuted")
        .order_by(Finding.created_at.desc(), Finding.id)
        .limit(limit)
    ).all()


def validated_bounds(session: Session, fingerprint: str) -> Sequence[Finding]:
    return session.scalars(
        select(Finding)
        .where(
            Finding.fingerprint == fingerprint,
            Finding.kind == "bound",
            Finding.status == "validated",
        )
        .order_by(Finding.created_at, Finding.id)
    ).all()


def events(session: Session, finding_id: str) -> Sequence[FindingEvent]:
    return session.scalars(
        select(FindingEvent)
        .where(FindingEvent.finding_id == finding_id)
        .order_by(FindingEvent.at, FindingEvent.id)
    ).all()


def events_by_finding(session: Session, ids: Sequence[str]) -> dict[str, list[FindingEvent]]:
    grouped: dict[str, list[FindingEvent]] = {i: [] for i in ids}
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        rows = session.scalars(
            select(FindingEvent)
            .where(FindingEvent.finding_id.in_(chunk))
            .order_by(FindingEvent.at, FindingEvent.id)
        )
        for event in rows:
            grouped[event.finding_id].append(event)
    return grouped


def all_findings(session: Session) -> Sequence[Finding]:
    """Every finding in export order: project (general last), kind, then age."""
    return session.scalars(_export_order()).all()


def findings_in_batches(session: Session, size: int) -> Iterator[Sequence[Finding]]:
    """Every finding in export order, `size` at a time, streamed from the database."""
    result = session.scalars(_export_order().execution_options(yield_per=size))
    yield from result.partitions(size)


def _export_order() -> Select[Finding]:
    return select(Finding).order_by(
        Finding.project.is_(None),
        Finding.project,
        Finding.kind,
        Finding.created_at,
        Finding.id,
    )


def add(session: Session, rows: Iterable[Finding | FindingEvent]) -> None:
    session.add_all(rows)
    session.flush()


def flush(session: Session) -> None:
    session.flush()
