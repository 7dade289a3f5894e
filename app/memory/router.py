"""REST routes of research memory: parse, call one service function, return a schema."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Response, UploadFile, status

from app.api.deps import AdminToken, AnyToken, MemorySession, ReviewToken, TriggerToken
from app.memory import service
from app.memory.exchange import MAX_IMPORT_BYTES
from app.memory.schemas import (
    ExportFormat,
    FindingCreate,
    FindingDetail,
    FindingOut,
    ImportFormat,
    ImportReport,
    ImportStatus,
    Kind,
    RefuteBody,
    SearchPage,
    Status,
    SupersedeBody,
    ValidateBody,
)

router = APIRouter(prefix="/memory", tags=["memory"])

_EXPORT_TYPES = {"jsonl": "application/x-ndjson", "markdown": "text/markdown; charset=utf-8"}


@router.get("/findings", response_model=SearchPage)
def search_findings(
    session: MemorySession,
    _: AnyToken,
    q: Annotated[str, Query(max_length=1000, description="Terms, all must appear")] = "",
    project: str | None = None,
    kind: Kind | None = None,
    status: Status | None = None,
    device_kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=service.MAX_PAGE)] = 20,
    offset: Annotated[int, Query(ge=0, le=service.MAX_OFFSET)] = 0,
) -> SearchPage:
    return service.search(
        session,
        q,
        project=project,
        kind=kind,
        status=status,
        device_kind=device_kind,
        limit=limit,
        offset=offset,
    )


@router.post("/findings", status_code=status.HTTP_201_CREATED, response_model=FindingOut)
def create_finding(body: FindingCreate, session: MemorySession, token: TriggerToken) -> FindingOut:
    return FindingOut.from_model(service.create(session, body, token.name))


@router.get("/findings/{finding_id}", response_model=FindingDetail)
def get_finding(finding_id: str, session: MemorySession, _: AnyToken) -> FindingDetail:
    return service.detail(session, finding_id)


@router.post("/findings/{finding_id}/validate", response_model=FindingOut)
def validate_finding(
    finding_id: str, session: MemorySession, token: ReviewToken, body: ValidateBody | None = None
) -> FindingOut:
    reason = body.reason if body else None
    return FindingOut.from_model(service.validate(session, finding_id, token.name, reason))


@router.post("/findings/{finding_id}/refute", response_model=FindingOut)
def refute_finding(
    finding_id: str, body: RefuteBody, session: MemorySession, token: ReviewToken
) -> FindingOut:
    return FindingOut.from_model(service.refute(session, finding_id, token.name, body.reason))


@router.post(
    "/findings/{finding_id}/supersede",
    status_code=status.HTTP_201_CREATED,
    response_model=FindingOut,
)
def supersede_finding(
    finding_id: str, body: SupersedeBody, session: MemorySession, token: ReviewToken
) -> FindingOut:
    new = service.supersede(session, finding_id, body.finding, token.name, body.reason)
    return FindingOut.from_model(new)


@router.post("/import", response_model=ImportReport)
def import_findings(
    file: Annotated[UploadFile, File(description="JSON Lines, Markdown or property export")],
    session: MemorySession,
    token: AdminToken,
    format: Annotated[ImportFormat, Form()] = "auto",
    status: Annotated[ImportStatus, Form(description="For the property export")] = "proposed",
) -> ImportReport:
    # One byte past the limit is enough to refuse; the rest is never read into memory.
    data = file.file.read(MAX_IMPORT_BYTES + 1)
    return service.import_file(session, data, format=format, status=status, actor=token.name)


@router.get("/export", response_class=Response)
def export_findings(
    session: MemorySession, _: AnyToken, format: ExportFormat = "jsonl"
) -> Response:
    body = service.export(session, format)
    filename = "memory.jsonl" if format == "jsonl" else "memory.md"
    return Response(
        body,
        media_type=_EXPORT_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
