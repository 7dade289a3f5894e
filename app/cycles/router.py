"""REST routes of cycles: trigger (idempotent by key), list, show, cancel."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from sqlalchemy.orm import Session

from app.api.deps import (
    MAX_OFFSET,
    AnyToken,
    OpsSession,
    ReviewToken,
    RowId,
    TriggerToken,
    get_doorbell,
    get_settings,
    get_stores,
    page_headers,
)
from app.cycles import review, schedules, service
from app.cycles.models import Cycle, CycleStep
from app.cycles.schemas import (
    AutopilotOut,
    AutopilotSet,
    CycleCreate,
    CycleOut,
    ReviewDecision,
    StepOut,
)
from app.cycles.states import CycleState
from app.db import Stores
from app.jobs import service as jobs
from app.reports import progress_plot
from app.settings import Settings

router = APIRouter(prefix="/cycles", tags=["cycles"])


def _out(cycle: Cycle, job_ids: dict[int, int], steps: Sequence[CycleStep] = ()) -> CycleOut:
    out = CycleOut.model_validate(cycle)
    out.job_id = job_ids.get(cycle.id)
    out.steps = [StepOut.model_validate(s) for s in steps]
    return out


def _one(session: Session, cycle: Cycle, steps: Sequence[CycleStep] = ()) -> CycleOut:
    return _out(cycle, jobs.ids_for_cycles(session, [cycle.id]), steps)


IDEMPOTENCY_KEY_MAX = 128
_IDEMPOTENCY_KEY_DOC = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "maxLength": IDEMPOTENCY_KEY_MAX, "title": "Idempotency-Key"},
}


def _idempotency_key(request: Request) -> str | None:
    """The optional `Idempotency-Key` header, checked as a declared `Header(max_length=128)`
    would be (the same 422), but read here: a declared header parameter costs the route
    FastAPI's parameter solving (query, header and cookie parsing) on every request."""
    key = request.headers.get("idempotency-key")
    if key is not None and len(key) > IDEMPOTENCY_KEY_MAX:
        raise RequestValidationError(
            [
                {
                    "type": "string_too_long",
                    "loc": ("header", "idempotency-key"),
                    "msg": f"String should have at most {IDEMPOTENCY_KEY_MAX} characters",
                    "input": key,
                    "ctx": {"max_length": IDEMPOTENCY_KEY_MAX},
                }
            ]
        )
    return key


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=CycleOut,
    openapi_extra={"parameters": [_IDEMPOTENCY_KEY_DOC]},
)
async def trigger_cycle(body: CycleCreate, request: Request, token: TriggerToken) -> Response:
    # The hot route (bench/cycle_overhead.py measures it): app state and the optional header are
    # read off the request
    # rather than through a dependency each, and the answer is serialised once, here (FastAPI
    # would validate the returned model against `response_model` again); the docs keep the
    # declared model and header. The unit of work runs on the store's writer
    # (`Stores.run_write`), off the event loop.
    idempotency_key = _idempotency_key(request)
    settings, stores = get_settings(request), get_stores(request)
    key, request_hash = (
        service.idempotency(token.name, idempotency_key, body.model_dump(mode="json"))
        if idempotency_key
        else (None, None)
    )
    trigger = service.Trigger(
        project=body.project,
        agent=body.agent,
        experiment=body.experiment,
        parameters=dict(body.parameters) if body.parameters else None,
        changed_hypothesis=body.changed_hypothesis,
        idempotency_key=key,
        request_hash=request_hash,
    )
    out, created = await stores.run_write(
        functools.partial(_record_trigger, stores, settings, trigger)
    )
    if created:
        # After the commit; sent by the coalescer's thread, one message per burst: the caller
        # does not wait on the broker. One lost (the process dies first) the reaper rings again.
        get_doorbell(request).add(out.id)
    return Response(
        out.model_dump_json(),
        status_code=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        media_type="application/json",
    )


def _record_trigger(
    stores: Stores, settings: Settings, trigger: service.Trigger
) -> tuple[CycleOut, bool]:
    """The trigger's one unit of work: the cycle recorded (or the replayed one found)."""
    with stores.ops_write_session() as session:
        cycle, created = service.create(
            session,
            trigger,
            max_live=settings.max_live_cycles_per_project,
            key_ttl_s=settings.idempotency_ttl_s,
        )
        # A new cycle has no job yet: only a replayed one is looked up.
        return (_one(session, cycle) if not created else _out(cycle, {})), created


@router.get("", response_model=list[CycleOut])
def list_cycles(
    request: Request,
    response: Response,
    session: OpsSession,
    _: AnyToken,
    project: str | None = None,
    state: CycleState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[CycleOut]:
    """Cycles, newest first, a page at a time: `X-Total-Count` says how many match, and a
    `Link: <...>; rel="next"` header points to the next page while there is one."""
    rows, total = service.list_cycles(
        session, project=project, state=state, limit=limit, offset=offset
    )
    page_headers(request, response, total=total, limit=limit, offset=offset)
    job_ids = jobs.ids_for_cycles(session, [c.id for c in rows])
    return [_out(c, job_ids) for c in rows]


@router.get("/{cycle_id}", response_model=CycleOut)
def get_cycle(cycle_id: RowId, session: OpsSession, _: AnyToken) -> CycleOut:
    return _one(session, service.get(session, cycle_id), service.steps(session, cycle_id))


@router.post("/{cycle_id}/cancel", response_model=CycleOut)
def cancel_cycle(cycle_id: RowId, session: OpsSession, token: TriggerToken) -> CycleOut:
    return _one(session, service.cancel(session, cycle_id, token.name))


@router.post("/{cycle_id}/review", response_model=CycleOut)
def review_cycle(
    cycle_id: RowId,
    body: ReviewDecision,
    token: ReviewToken,
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> CycleOut:
    """Approve (validates the findings; optionally merges) or reject (refutes them)."""
    review.review(
        stores,
        settings,
        cycle_id,
        approve=body.decision == "approve",
        note=body.note,
        actor=token.name,
        merge=body.merge,
    )
    with stores.ops_session() as session:
        return _one(session, service.get(session, cycle_id), service.steps(session, cycle_id))


autopilot_router = APIRouter(prefix="/projects", tags=["projects"])


@autopilot_router.post("/{name}/autopilot", response_model=AutopilotOut)
def set_autopilot(
    name: str, body: AutopilotSet, session: OpsSession, _: TriggerToken
) -> AutopilotOut:
    """Start or stop a project's schedule (`every 2h` or a cron expression)."""
    return AutopilotOut.model_validate(
        schedules.set_autopilot(session, name, body.enabled, body.schedule)
    )


@autopilot_router.get(
    "/{name}/plot",
    response_class=Response,
    responses={200: {"content": {"image/svg+xml": {}}, "description": "An SVG chart"}},
)
def get_project_plot(
    name: str,
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
    _: AnyToken,
    kind: Literal["trend", "space"] = "trend",
    experiment: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """The project's progress as SVG: `trend`, the headline ratio of each cycle with its CI and
    the best so far; `space`, an experiment's parameter space coloured by verdict (name the
    experiment when the project has several). Each cycle's mark links to its dashboard page."""
    svg = progress_plot.plot(settings, stores, name, kind, experiment)
    return Response(
        progress_plot.document(svg),
        media_type="image/svg+xml",
        headers={
            "Content-Security-Policy": "default-src 'none'",
            "X-Content-Type-Options": "nosniff",
        },
    )
