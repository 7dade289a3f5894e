"""What is running: the list of cycles with their steps, and the GPU queue with its workers and
budgets. Both are live pages (`live.py`).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from app.api.deps import SettingsDep, StoresDep
from app.cycles import states
from app.dashboard import live, views
from app.dashboard.auth import PREFIX
from app.dashboard.pages import MaybeViewer, clean_filter, from_exception, render, to_login
from app.errors import NotFound

router = APIRouter(include_in_schema=False)


@router.get(PREFIX + "/cycles")
def cycle_list(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    project: str | None = None,
    state: str | None = None,
) -> Response:
    if viewer is None:
        return to_login(request)
    filters = {"project": clean_filter(project), "state": clean_filter(state)}
    version = live.version(stores, "cycles")
    try:
        rows, projects = views.cycle_list(stores, **filters)
    except NotFound as exc:
        return from_exception(request, viewer, exc)
    every_state = (*states.LIVE, *states.WAITING, *states.TERMINAL)
    return render(
        request,
        "cycles.html",
        viewer,
        rows=rows,
        projects=projects,
        filters=filters,
        states=every_state,
        live=any(r.cycle.state in states.LIVE for r in rows),
        live_topic="cycles",
        live_version=version,
    )


@router.get(PREFIX + "/queue")
def gpu_queue(
    request: Request, viewer: MaybeViewer, stores: StoresDep, settings: SettingsDep
) -> Response:
    if viewer is None:
        return to_login(request)
    version = live.version(stores, "queue")
    page = views.gpu_queue(settings, stores)
    return render(
        request,
        "gpu_queue.html",
        viewer,
        page=page,
        live=True,
        live_topic="queue",
        live_version=version,
    )
