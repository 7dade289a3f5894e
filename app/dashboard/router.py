"""The review dashboard: server-rendered pages under /dashboard (review queue, PR detail with the
decision form, cycles, campaigns, GPU queue, memory). Every page works without JavaScript; the
one script keeps live pages current: it listens to `/dashboard/live/<topic>` (server-sent events,
`live.py`) and swaps in the page's fresh `<main>` when told it changed.

Mount with `app.include_router(dashboard_router)`: the router carries its own paths, the `/`
redirect, its static files and the live stream, and gathers the page routers (`signin.py`,
`review.py`, `operations.py`, `campaigns.py`, `projects.py`, `findings.py`), so no StaticFiles
mount is needed.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import RedirectResponse, Response

from app.api import streams
from app.api.deps import SettingsDep, StoresDep
from app.dashboard import campaigns, findings, live, operations, projects, review, signin
from app.dashboard.auth import PREFIX
from app.dashboard.pages import HERE, MaybeViewer

STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}

dashboard_router = APIRouter(include_in_schema=False)


@dashboard_router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/", status_code=307)


@dashboard_router.get(PREFIX)
def dashboard_root() -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/", status_code=307)


@dashboard_router.get(PREFIX + "/static/{name}")
def static(name: str) -> Response:
    media_type = STATIC.get(name)
    if media_type is None:
        return Response("not found", status_code=404, media_type="text/plain")
    response = Response((HERE / "static" / name).read_bytes(), media_type=media_type)
    response.headers["Cache-Control"] = "public, max-age=3600"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@dashboard_router.get(PREFIX + "/live/{topic}")
def live_stream(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    topic: str,
    since: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Server-sent events: `changed` whenever what `topic`'s pages show has moved on."""
    if viewer is None:
        return Response("sign in first", status_code=401, media_type="text/plain")
    if topic not in live.TOPICS:
        known = ", ".join(sorted(live.TOPICS))
        return Response(
            f"no live topic {topic!r}; one of {known}", status_code=404, media_type="text/plain"
        )
    last = request.headers.get("last-event-id", "")[:64] or since
    try:
        return streams.event_stream(
            live.stream(stores, topic, last, request.is_disconnected),
            owner=viewer.name,
            limit=settings.max_streams_per_token,
        )
    except streams.TooManyStreams as exc:
        return Response(exc.detail, status_code=429, media_type="text/plain")


for pages in (signin, review, operations, campaigns, projects, findings):
    dashboard_router.include_router(pages.router)
