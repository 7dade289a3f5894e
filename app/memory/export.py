"""Research memory exported whole: JSON Lines (lossless, audit trail included) or Markdown (for
people), a batch of findings at a time."""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy.orm import Session

from app.memory import exchange, repository
from app.memory.schemas import ExportFormat, FindingRecord, record_of


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
