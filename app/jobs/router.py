"""REST routes of the GPU handoff queue. The doorbell is rung only after the commit."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Query, status
from fastapi.responses import PlainTextResponse, StreamingResponse

from app.api.deps import (
    MAX_OFFSET,
    AnyToken,
    OpsSession,
    RowId,
    SettingsDep,
    StoresDep,
    TriggerToken,
)
from app.db import Stores
from app.jobs import figures, paths
from app.jobs import service as jobs
from app.jobs.models import FINISHED
from app.jobs.schemas import JobCreate, JobOut, QueueOut, WorkerOut
from app.projects import service as ops

router = APIRouter(tags=["gpu queue"])
LOG_TAIL_BYTES = 64 * 1024
JobState = Literal["queued", "leased", "running", "succeeded", "failed", "cancelled"]


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobOut)
def submit_job(
    body: JobCreate, _: TriggerToken, stores: StoresDep, settings: SettingsDep
) -> JobOut:
    return jobs.submit_and_ring(
        stores, settings, body.project, body.experiment, dict(body.parameters), queue=body.queue
    )


@router.get("/jobs", response_model=list[JobOut])
def list_jobs(
    session: OpsSession,
    _: AnyToken,
    settings: SettingsDep,
    queue: Annotated[str | None, Query(description="gpu.<kind>")] = None,
    state: JobState | None = None,
    project: str | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET)] = 0,
) -> list[JobOut]:
    if queue is not None:
        jobs.parse_queue(settings, queue)  # an unknown queue is a 422, not an empty list
    project_id = ops.get_project(session, project).id if project else None
    rows = jobs.list_jobs(
        session, queue=queue, state=state, project_id=project_id, limit=limit, offset=offset
    )
    return [JobOut.model_validate(j) for j in rows]


@router.get("/jobs/{job_id}", response_model=JobOut)
def get_job(job_id: RowId, session: OpsSession, _: AnyToken) -> JobOut:
    return JobOut.model_validate(jobs.get(session, job_id))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel_job(job_id: RowId, session: OpsSession, token: TriggerToken) -> JobOut:
    return JobOut.model_validate(jobs.cancel(session, job_id, by=token.name))


@router.get("/jobs/{job_id}/log", response_model=None)
def job_log(
    job_id: RowId,
    _: AnyToken,
    stores: StoresDep,
    settings: SettingsDep,
    follow: bool = False,
) -> PlainTextResponse | StreamingResponse:
    """The log's tail; with `?follow=1`, a server-sent-events stream until the job ends."""
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        path = paths.log_path(settings, job_id, job.log_path)
    if not follow:
        return PlainTextResponse(_tail(path))
    return StreamingResponse(_follow(stores, job_id, path), media_type="text/event-stream")


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""


async def _follow(stores: Stores, job_id: int, path: Path) -> AsyncIterator[str]:
    offset = 0
    while True:
        chunk = ""
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                data = handle.read(LOG_TAIL_BYTES)
                offset += len(data)
                chunk = data.decode("utf-8", "replace")
        except FileNotFoundError:
            pass
        for line in chunk.splitlines():
            yield f"data: {line}\n\n"
        with stores.ops_session() as session:
            state = jobs.get(session, job_id).state
        if state in FINISHED and not chunk:
            yield f"event: end\ndata: {state}\n\n"
            return
        await asyncio.sleep(0.5)


@router.get("/workers", response_model=list[WorkerOut])
def list_workers(session: OpsSession, _: AnyToken) -> list[WorkerOut]:
    return [WorkerOut.model_validate(w) for w in jobs.list_workers(session)]


@router.get("/queues", response_model=list[QueueOut])
def list_queues(session: OpsSession, _: AnyToken, settings: SettingsDep) -> list[QueueOut]:
    return [QueueOut.model_validate(q) for q in figures.queues(session, settings)]
