"""REST routes of research memory: parse, call one service function, return a schema."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, File, Form, Query, UploadFile, status
from fastapi.responses import StreamingResponse

from app.api.deps import (
    AdminToken,
    AnyToken,
    MemorySession,
    ReviewToken,
    StoresDep,
    TriggerToken,
)
from app.errors import Forbidden
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
    """A finding, `proposed`. Its provenance (source, source and publication status, evidence)
    is the admin's to state, or an import's: another token's finding is `unverified`, with the
    token as its source."""
    if "admin" not in token.scopes:
        claimed = _provenance_claims(body)
        if claimed:
            raise Forbidden(
                f"only an admin token (or an import) may set a finding's provenance: "
                f"{', '.join(claimed)}; leave them out, and the finding is recorded as "
                f"unverified with token {token.name!r} as its source"
            )
        body = body.model_copy(
            update={"source": f"api token {token.name}", "source_status": "unverified"}
        )
    return FindingOut.from_model(service.create(session, body, token.name))


def _provenance_claims(body: FindingCreate) -> list[str]:
    """The provenance fields `body` states beyond a plain, unverified finding's."""
    plain = FindingCreate(kind=body.kind, statement=body.statement)
    return [
        name
        for name in ("evidence", "publication_status", "source", "source_status")
        if getattr(body, name) != getattr(plain, name)
    ]


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


@router.get("/export", response_class=StreamingResponse)
def export_findings(
    stores: StoresDep, _: ReviewToken, format: ExportFormat = "jsonl"
) -> StreamingResponse:
    """The whole store, streamed a batch of findings at a time (scope review or admin: it is
    everything memory holds, unreviewed findings included)."""

    def body() -> Iterator[bytes]:
        # Its own session: the request's ends when the route returns, before the body is sent.
        with stores.memory_session() as session:
            for chunk in service.export_chunks(session, format):
                yield chunk.encode()

    # A store that is down is a 503 here, not an empty 200 once the stream has begun (the
    # token check may be answered from the token cache, without a DB round trip).
    with stores.memory_session() as session:
        session.connection()
    filename = "memory.jsonl" if format == "jsonl" else "memory.md"
    return StreamingResponse(
        body(),
        media_type=_EXPORT_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )
