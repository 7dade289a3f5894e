"""The research memory on the dashboard: full-text search with filters, and one finding."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.api.deps import StoresDep
from app.dashboard.auth import PREFIX
from app.dashboard.pages import MaybeViewer, clean_filter, from_exception, render, to_login
from app.errors import AutopilotError, InvalidInput
from app.memory import service as memory
from app.projects import service as ops

router = APIRouter(include_in_schema=False)


@router.get(PREFIX + "/memory")
def memory_search(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    q: Annotated[str, Query(max_length=500)] = "",
    project: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    device: str | None = None,
    offset: Annotated[int, Query(ge=0, le=10_000)] = 0,
) -> Response:
    if viewer is None:
        return to_login(request)
    filters = {
        "project": clean_filter(project),
        "kind": clean_filter(kind),
        "status": clean_filter(status),
        "device": clean_filter(device),
    }
    error = None
    results = None
    with stores.memory_session() as session:
        try:
            results = memory.search(
                session,
                q.strip(),
                project=filters["project"],
                kind=filters["kind"],
                status=filters["status"],
                device_kind=filters["device"],
                offset=offset,
            )
        except InvalidInput as exc:
            error = exc.detail
    with stores.ops_session() as session:
        projects = sorted(ops.project_names(session).values())
    next_query = None
    if results is not None and results.next_offset is not None:
        params = {k: v for k, v in {"q": q, **filters}.items() if v}
        next_query = urlencode({**params, "offset": results.next_offset})
    return render(
        request,
        "memory.html",
        viewer,
        q=q,
        filters=filters,
        results=results,
        error=error,
        projects=projects,
        next_query=next_query,
    )


@router.get(PREFIX + "/memory/{finding_id}")
def finding_detail(
    request: Request, viewer: MaybeViewer, stores: StoresDep, finding_id: str
) -> Response:
    if viewer is None:
        return to_login(request)
    with stores.memory_session() as session:
        try:
            finding = memory.detail(session, finding_id)
        except AutopilotError as exc:
            return from_exception(request, viewer, exc)
    cycle_link = None
    if finding.evidence.cycle_id and finding.evidence.cycle_id.isdigit():
        cycle_link = f"{PREFIX}/cycles/{quote(finding.evidence.cycle_id)}"
    return render(request, "finding.html", viewer, f=finding, cycle_link=cycle_link)
