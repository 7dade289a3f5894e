"""Validated shapes of research memory: the API, the CLI and the JSON Lines format share them."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.memory.models import Finding, FindingEvent

Kind = Literal["lesson", "verdict", "bound", "policy"]
Status = Literal["proposed", "validated", "refuted", "superseded"]
SourceStatus = Literal["verified", "unverified"]
PublicationStatus = Literal["verified", "unverified", "not_applicable"]
ExportFormat = Literal["jsonl", "markdown"]
ImportFormat = Literal["auto", "jsonl", "markdown", "property-export"]
ImportStatus = Literal["proposed", "validated"]

SLUG = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
FINGERPRINT = r"^[0-9a-f]{64}$"
FINDING_ID = r"^[A-Za-z0-9_-]{1,32}$"
MAX_STATEMENT_CHARS = 100_000


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Evidence(BaseModel):
    """Where a finding comes from, as plain values (no key into the ops DB)."""

    model_config = ConfigDict(extra="forbid")

    cycle_id: str | None = Field(default=None, max_length=64)
    commit: str | None = Field(default=None, max_length=64)
    pr_url: str | None = Field(default=None, max_length=1024)
    result_path: str | None = Field(default=None, max_length=1024)


class FindingCreate(BaseModel):
    """A new finding. Its statement is stored exactly as given (no trimming, no filling in)."""

    model_config = ConfigDict(extra="forbid")

    project: str | None = Field(default=None, description="Project slug; none for general lessons")
    kind: Kind
    statement: str = Field(min_length=1, max_length=MAX_STATEMENT_CHARS)
    language: str | None = Field(default=None, max_length=16, description="Detected if omitted")
    hypothesis: str | None = Field(default=None, max_length=MAX_STATEMENT_CHARS)
    fingerprint: str | None = Field(default=None, pattern=FINGERPRINT)
    device_kind: str | None = Field(default=None, max_length=64)
    scope: dict[str, Any] = Field(default_factory=dict, description="Shapes, sizes, versions")
    metrics: dict[str, Any] = Field(default_factory=dict)
    source: str | None = Field(default=None, max_length=4096, description="The primary source")
    source_status: SourceStatus = "unverified"
    publication_status: PublicationStatus | None = Field(
        default=None, description="Derived from source_status if omitted"
    )
    truncated: bool = False
    group: str | None = Field(default=None, max_length=64)
    tags: list[str] = Field(default_factory=list, max_length=64)
    evidence: Evidence = Field(default_factory=Evidence)
    supersedes: str | None = Field(default=None, pattern=FINDING_ID)

    @field_validator("project")
    @classmethod
    def _project(cls, value: str | None) -> str | None:
        if value is not None and not SLUG.fullmatch(value):
            raise ValueError(f"project {value!r} is not a slug (lower-case, digits, '.', '_', '-')")
        return value

    @field_validator("statement")
    @classmethod
    def _statement(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("statement is blank")
        if "\x00" in value:
            raise ValueError("statement holds a NUL character")
        return value

    @model_validator(mode="after")
    def _provenance(self) -> FindingCreate:
        # docs/design.md, "Unverified stays unverified": a finding whose primary source was not
        # found is unverified in
        # both source and publication status; a cut-off one stays unverified.
        if self.truncated and self.source_status == "verified":
            raise ValueError("source_status: a truncated finding stays 'unverified'")
        if self.source_status == "unverified":
            if self.publication_status not in (None, "unverified"):
                raise ValueError(
                    "publication_status: must be 'unverified' while source_status is 'unverified'"
                )
            self.publication_status = "unverified"
        elif self.publication_status is None:
            self.publication_status = "not_applicable"
        return self


class EventOut(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_status: Status | None
    to_status: Status
    actor: str = Field(max_length=64)
    reason: str | None = None
    at: datetime

    @classmethod
    def from_model(cls, event: FindingEvent) -> EventOut:
        return cls.model_validate(
            {
                "from_status": event.from_status,
                "to_status": event.to_status,
                "actor": event.actor,
                "reason": event.reason,
                "at": as_utc(event.at),
            }
        )


class FindingRecord(FindingCreate):
    """One line of our JSON Lines format: a finding with its status, ids and audit trail."""

    id: str | None = Field(default=None, pattern=FINDING_ID)
    status: Status = "proposed"
    validated_by: str | None = Field(default=None, max_length=64)
    validated_at: datetime | None = None
    created_at: datetime | None = None
    events: list[EventOut] = Field(default_factory=list)


def _common(finding: Finding) -> dict[str, Any]:
    return {
        "id": finding.id,
        "project": finding.project,
        "kind": finding.kind,
        "statement": finding.statement,
        "language": finding.language,
        "hypothesis": finding.hypothesis,
        "fingerprint": finding.fingerprint,
        "device_kind": finding.device_kind,
        "scope": finding.scope,
        "metrics": finding.metrics,
        "status": finding.status,
        "source": finding.source,
        "source_status": finding.source_status,
        "publication_status": finding.publication_status,
        "truncated": finding.truncated,
        "group": finding.group_name,
        "tags": finding.tags,
        "evidence": {
            "cycle_id": finding.cycle_id,
            "commit": finding.commit_sha,
            "pr_url": finding.pr_url,
            "result_path": finding.result_path,
        },
        "validated_by": finding.validated_by,
        "validated_at": as_utc(finding.validated_at),
        "supersedes": finding.supersedes,
        "created_at": as_utc(finding.created_at),
    }


def record_of(finding: Finding, events: list[FindingEvent]) -> FindingRecord:
    return FindingRecord.model_validate(
        {**_common(finding), "events": [EventOut.from_model(e) for e in events]}
    )


class FindingOut(BaseModel):
    id: str
    project: str | None
    kind: Kind
    statement: str
    language: str
    hypothesis: str | None
    fingerprint: str | None
    device_kind: str | None
    scope: dict[str, Any]
    metrics: dict[str, Any]
    status: Status
    source: str | None
    source_status: SourceStatus
    publication_status: PublicationStatus
    truncated: bool
    group: str | None
    tags: list[str]
    evidence: Evidence
    validated_by: str | None
    validated_at: datetime | None
    supersedes: str | None
    content_hash: str
    created_at: datetime

    @classmethod
    def from_model(cls, finding: Finding) -> FindingOut:
        return cls.model_validate({**_common(finding), "content_hash": finding.content_hash})


class FindingDetail(FindingOut):
    events: list[EventOut]
    superseded_by: list[str]


class ValidateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str | None = Field(default=None, max_length=4096)


class RefuteBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(min_length=1, max_length=4096, description="Why the finding is refuted")

    @field_validator("reason")
    @classmethod
    def _reason(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("reason is blank; say why the finding is refuted")
        return value


class SupersedeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    finding: FindingCreate = Field(description="The new finding that replaces the validated one")
    reason: str | None = Field(default=None, max_length=4096)


class SearchPage(BaseModel):
    items: list[FindingOut]
    limit: int
    offset: int
    next_offset: int | None = Field(description="Offset of the next page; null on the last page")


class ImportReport(BaseModel):
    format: str
    imported: int
    duplicates: int
    by_project: dict[str, int] = Field(description="Imported findings per project; 'null': none")
    truncated: int
