"""REST routes of the GPU handoff queue. The doorbell is rung only after the commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from sse_starlette import EventSourceResponse

from app.api import streams
from app.api.deps import (
    MAX_OFFSET,
    AnyToken,
    OpsSession,
    RowId,
    SettingsDep,
    StoresDep,
    TriggerToken,
    page_headers,
    require,
)
from app.api.problems import PROBLEM_JSON
from app.db import Stores
from app.jobs import figures, logs, submission
from app.jobs import service as jobs
from app.jobs.lifecycle import FINISHED, StateName
from app.jobs.schemas import JobCreate, JobLogStored, JobOut, QueueOut, WorkerOut
from app.projects import service as ops
from app.projects.models import ApiToken
from app.settings import Settings

router = APIRouter(tags=["gpu queue"])
# The upload's route; app.api.main gives it a body limit of its own (max_job_log_bytes).
LOG_ROUTE = "/jobs/{job_id}/log"
LOG_ROUTE_PATTERN = r"/jobs/[0-9]+/log"
FOLLOW_POLL_S = 0.5
# A GPU host's token (scope worker, or admin) hands logs in; reading them needs a reader's.
WorkerToken = Annotated[ApiToken, Depends(require("worker"))]


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def submit_job(
    body: JobCreate, _: TriggerToken, stores: StoresDep, settings: SettingsDep
) -> JobOut:
    return submission.submit_and_ring(
        stores, settings, body.project, body.experiment, dict(body.parameters), queue=body.queue
    )


@router.get("/jobs", response_model=list[JobOut])
def list_jobs(
    request: Request,
    response: Response,
    session: OpsSession,
    _: AnyToken,
    settings: SettingsDep,
    queue: Annotated[str | None, Query(description="gpu.<kind>")] = None,
    state: StateName | None = None,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[JobOut]:
    """Jobs, newest first, a page at a time (`X-Total-Count`, `Link: rel="next"`)."""
    if queue is not None:
        jobs.parse_queue(settings, queue)  # an unknown queue is a 422, not an empty list
    project_id = ops.get_project(session, project).id if project else None
    rows = jobs.list_jobs(
        session, queue=queue, state=state, project_id=project_id, limit=limit, offset=offset
    )
    total = jobs.count_jobs(session, queue=queue, state=state, project_id=project_id)
    page_headers(request, response, total=total, limit=limit, offset=offset)
    names = ops.project_names(session)
    return [
        JobOut.model_validate(j).model_copy(update={"project": names.get(j.project_id)})
        for j in rows
    ]


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: RowId, session: OpsSession, _: AnyToken) -> JobOut:
    return JobOut.model_validate(jobs.get(session, job_id))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: RowId, session: OpsSession, token: TriggerToken) -> JobOut:
    return JobOut.model_validate(jobs.cancel(session, job_id, by=token.name))


@router.get(LOG_ROUTE, response_model=None)
def job_log(
    job_id: RowId,
    token: AnyToken,
    stores: StoresDep,
    settings: SettingsDep,
    follow: bool = False,
) -> PlainTextResponse | StreamingResponse | EventSourceResponse:
    """The whole log once uploaded (else the tail the DB keeps while the job runs on a GPU host);
    with `?follow=1`, a server-sent-events stream until the job ends."""
    if follow:
        with stores.ops_session() as session:
            jobs.get(session, job_id)  # an unknown job is a 404, not an empty stream
        return streams.event_stream(
            _follow(stores, settings, job_id),
            owner=token.name,
            limit=settings.max_streams_per_token,
        )
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        path, tail = logs.stored_log(settings, job), job.log_tail
    chunks = logs.whole_log(path) if path is not None else None
    if chunks is None:
        return PlainTextResponse(tail or "")
    return StreamingResponse(chunks, media_type="text/plain; charset=utf-8")


@router.put(
    LOG_ROUTE,
    response_model=JobLogStored,
    responses={
        415: {
            "description": "The body is not text/plain or application/octet-stream",
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
    },
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "text/plain": {"schema": {"type": "string"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    },
)
async def upload_job_log(
    job_id: RowId, request: Request, _: WorkerToken, stores: StoresDep, settings: SettingsDep
) -> JobLogStored:
    """A GPU host hands in a job's whole log (the request body) when the job ends; it replaces
    any earlier copy at once, never half-written. Larger than AUTOPILOT_MAX_JOB_LOG_BYTES: 413."""
    size = await logs.receive_upload(
        stores, settings, job_id, request.headers.get("content-type"), request.stream()
    )
    return JobLogStored(job_id=job_id, bytes=size)


def _follow_step(
    stores: Stores, settings: Settings, job_id: int, follower: logs.LogFollower
) -> tuple[str, str]:
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        return job.state, follower.read(settings, job, final=job.state in FINISHED)


async def _follow(stores: Stores, settings: Settings, job_id: int) -> AsyncIterator[str]:
    # The file does not grow here while a GPU host runs the job: the DB's tail is re-read.
    follower = logs.LogFollower()
    while True:
        state, chunk = await to_thread.run_sync(_follow_step, stores, settings, job_id, follower)
        for line in chunk.splitlines():
            yield f"data: {line}\n\n"
        if follower.behind:
            continue
        if state in FINISHED:
            yield f"event: end\ndata: {state}\n\n"
            return
        await asyncio.sleep(FOLLOW_POLL_S)


@router.get("/workers", response_model=list[WorkerOut])
def list_workers(session: OpsSession, _: AnyToken) -> list[WorkerOut]:
    return [WorkerOut.model_validate(w) for w in jobs.list_workers(session)]


@router.get("/queues", response_model=list[QueueOut])
def list_queues(session: OpsSession, _: AnyToken, settings: SettingsDep) -> list[QueueOut]:
    return [QueueOut.model_validate(q) for q in figures.queues(session, settings)]
