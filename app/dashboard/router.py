"""The review dashboard: server-rendered pages under /dashboard (review queue, PR detail with the
decision form, cycles, GPU queue, memory). Every page works without JavaScript; the one script
keeps live pages current: it listens to `/dashboard/live/<topic>` (server-sent events,
`live.py`) and swaps in the page's fresh `<main>` when told it changed.

Mount with `app.include_router(dashboard_router)`: the router carries its own paths, the `/`
redirect and its static files, so no StaticFiles mount is needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from app.cycles import review as cycle_review
from app.cycles import service as cycles
from app.dashboard import auth, evidence, live, views
from app.db import Stores
from app.errors import AutopilotError, Conflict, InvalidInput, NotFound, Unauthorized
from app.forge.base import ProjectRef
from app.memory import service as memory
from app.memory.models import KINDS, STATUSES
from app.projects.models import Project
from app.settings import Settings

HERE = Path(__file__).parent
PREFIX = auth.PREFIX
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}
PAGE_CSP = (
    "default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
# An SVG opened directly must not run anything: no scripts, no loads, sandboxed.
SVG_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
MAX_NOTE_CHARS = 10_000

templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(("html",), default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["age"] = views.age
templates.filters["ratio"] = views.ratio_text
templates.filters["accuracy"] = views.accuracy_text
templates.globals.update(
    prefix=PREFIX,
    duration=views.duration,
    unverified=views.unverified,
    verdicts=views.VERDICTS,
    review_states=views.REVIEW_STATES,
    kinds=KINDS,
    statuses=STATUSES,
)

dashboard_router = APIRouter(include_in_schema=False)


# -- plumbing ----------------------------------------------------------------------------------


def _stores(request: Request) -> Stores:
    stores: Stores = request.app.state.stores
    return stores


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def _secure(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = PAGE_CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store"
    return response


def render(
    request: Request,
    name: str,
    viewer: auth.Viewer | None,
    status_code: int = 200,
    **context: Any,
) -> HTMLResponse:
    topic = context.pop("live_topic", None)
    if topic is not None and viewer is not None:
        # The page subscribes to its topic's stream from the version read *before* its data,
        # so a change in between is reported, not lost.
        context["live_url"] = f"{PREFIX}/live/{topic}"
        context.setdefault("live_version", live.version(_stores(request), topic))
    else:
        context.pop("live_version", None)
    html = templates.get_template(name).render(
        request_path=request.url.path, viewer=viewer, **context
    )
    response = HTMLResponse(html, status_code=status_code)
    _secure(response)
    return response


def _error(
    request: Request, viewer: auth.Viewer | None, status_code: int, title: str, detail: str
) -> HTMLResponse:
    return render(
        request, "error.html", viewer, status_code=status_code, title=title, detail=detail
    )


def _from_exception(request: Request, viewer: auth.Viewer | None, exc: AutopilotError) -> Response:
    return _error(request, viewer, exc.status, exc.title, exc.detail)


def _to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{PREFIX}/login?{urlencode({'next': target})}", status_code=303)


def _viewer(request: Request) -> auth.Viewer | None:
    return auth.current_viewer(_stores(request), request)


def _filter(value: str | None) -> str | None:
    return value.strip() or None if value else None


# -- the entry points ---------------------------------------------------------------------------


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


# -- signing in and out -------------------------------------------------------------------------


@dashboard_router.get(PREFIX + "/login")
def login_form(request: Request, next: str | None = None) -> Response:
    target = auth.safe_next(next)
    if _viewer(request) is not None:
        return RedirectResponse(target, status_code=303)
    csrf = auth.login_csrf(request)
    response = render(request, "login.html", None, next=target, csrf=csrf, error=None)
    auth.set_login_csrf(request, response, csrf)
    return response


@dashboard_router.post(PREFIX + "/login")
def login(
    request: Request,
    token: Annotated[str, Form(max_length=512)] = "",
    csrf_token: Annotated[str, Form(max_length=256)] = "",
    next: Annotated[str, Form(max_length=2048)] = "",
) -> Response:
    target = auth.safe_next(next)
    if not auth.same_origin(request) or not auth.check_login_csrf(request, csrf_token):
        return _error(
            request,
            None,
            403,
            "Form expired",
            "The sign-in form was not sent from this dashboard or has expired. "
            "Open the sign-in page again and retry.",
        )
    response = RedirectResponse(target, status_code=303)
    try:
        auth.login(_stores(request), request, response, token)
    except Unauthorized:
        csrf = auth.login_csrf(request)
        page = render(
            request,
            "login.html",
            None,
            status_code=401,
            next=target,
            csrf=csrf,
            error="That token is not valid or was revoked. Create one with "
            "`autopilot token create --name <name> --scope review`.",
        )
        auth.set_login_csrf(request, page, csrf)
        return page
    return response


@dashboard_router.post(PREFIX + "/logout")
def logout(request: Request, csrf_token: Annotated[str, Form(max_length=256)] = "") -> Response:
    viewer = _viewer(request)
    if viewer is not None and (
        not auth.same_origin(request) or not auth.check_csrf(viewer, csrf_token)
    ):
        return _error(request, viewer, 403, "Form expired", "Reload the page and sign out again.")
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    auth.logout(response)
    return response


# -- review queue and PR detail -------------------------------------------------------------------


@dashboard_router.get(PREFIX + "/")
def review_queue(
    request: Request,
    project: str | None = None,
    verdict: str | None = None,
    state: str | None = None,
) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    filters = {"project": _filter(project), "verdict": _filter(verdict), "state": _filter(state)}
    version = live.version(_stores(request), "cycles")
    try:
        waiting, decided, projects = views.review_queue(_stores(request), **filters)
    except NotFound as exc:
        return _from_exception(request, viewer, exc)
    return render(
        request,
        "queue.html",
        viewer,
        waiting=waiting,
        decided=decided,
        projects=projects,
        filters=filters,
        live_topic="cycles",
        live_version=version,
    )


def _cycle_page(
    request: Request,
    viewer: auth.Viewer,
    cycle_id: int,
    *,
    status_code: int = 200,
    error: str | None = None,
    note: str = "",
    done: str | None = None,
) -> Response:
    version = live.version(_stores(request), "cycles")
    try:
        page = views.cycle_page(
            _settings(request), _stores(request), cycle_id, f"{PREFIX}/cycles/{cycle_id}/plot.svg"
        )
    except AutopilotError as exc:
        return _from_exception(request, viewer, exc)
    return render(
        request,
        "cycle.html",
        viewer,
        status_code=status_code,
        page=page,
        c=page.cycle,
        error=error,
        note=note,
        done=done,
        forge=_settings(request).forge,
        live=page.cycle.state in cycles.LIVE,
        live_topic="cycles" if page.cycle.state in cycles.LIVE else None,
        live_version=version,
    )


@dashboard_router.get(PREFIX + "/cycles/{cycle_id}")
def cycle_detail(request: Request, cycle_id: int, done: str | None = None) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    return _cycle_page(
        request, viewer, cycle_id, done=done if done in ("approved", "rejected") else None
    )


@dashboard_router.get(PREFIX + "/cycles/{cycle_id}/plot.svg")
def cycle_plot(request: Request, cycle_id: int) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return Response("sign in first", status_code=401, media_type="text/plain")
    stores, settings = _stores(request), _settings(request)
    with stores.ops_session() as session:
        try:
            cycle = cycles.get(session, cycle_id)
        except NotFound:
            return Response("no such cycle", status_code=404, media_type="text/plain")
        project = session.get(Project, cycle.project_id)
        assert project is not None
        ref = ProjectRef.of(project)
        session.expunge(cycle)
    svg = evidence.report_file(settings, stores, cycle, ref, "plot.svg")
    if svg is None:
        return Response("this cycle has no plot", status_code=404, media_type="text/plain")
    return Response(
        svg,
        media_type="image/svg+xml",
        headers={
            "Content-Security-Policy": SVG_CSP,
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, max-age=300",
        },
    )


@dashboard_router.post(PREFIX + "/cycles/{cycle_id}/review")
def decide(
    request: Request,
    cycle_id: int,
    decision: Annotated[str, Form(max_length=16)] = "",
    note: Annotated[str, Form()] = "",
    merge: Annotated[str | None, Form(max_length=8)] = None,
    csrf_token: Annotated[str, Form(max_length=256)] = "",
) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _error(
            request, None, 401, "Not signed in", "Your session ended. Sign in and decide again."
        )
    if not auth.same_origin(request) or not auth.check_csrf(viewer, csrf_token):
        return _error(
            request,
            viewer,
            403,
            "Form expired",
            "The decision form was not sent from this page or has expired. Reload the PR and "
            "decide again; nothing was changed.",
        )
    if not viewer.can("review"):
        return _error(
            request,
            viewer,
            403,
            "Not allowed",
            f"Deciding needs a token with scope 'review'; {viewer.name!r} has "
            f"{', '.join(viewer.scopes) or 'none'}. Sign in with a review token.",
        )
    if decision not in ("approve", "reject"):
        return _cycle_page(
            request, viewer, cycle_id, status_code=422, error="Choose approve or reject.", note=note
        )
    if len(note) > MAX_NOTE_CHARS:
        return _cycle_page(
            request,
            viewer,
            cycle_id,
            status_code=422,
            error=f"The note is longer than {MAX_NOTE_CHARS} characters.",
            note=note[:MAX_NOTE_CHARS],
        )
    try:
        cycle_review.review(
            _stores(request),
            _settings(request),
            cycle_id,
            approve=decision == "approve",
            note=note,
            actor=viewer.name,
            merge=decision == "approve" and merge is not None,
        )
    except (InvalidInput, Conflict) as exc:
        return _cycle_page(
            request, viewer, cycle_id, status_code=exc.status, error=exc.detail, note=note
        )
    except AutopilotError as exc:
        return _from_exception(request, viewer, exc)
    done = "approved" if decision == "approve" else "rejected"
    return RedirectResponse(f"{PREFIX}/cycles/{cycle_id}?done={done}", status_code=303)


# -- cycles, GPU queue ---------------------------------------------------------------------------


@dashboard_router.get(PREFIX + "/cycles")
def cycle_list(request: Request, project: str | None = None, state: str | None = None) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    filters = {"project": _filter(project), "state": _filter(state)}
    version = live.version(_stores(request), "cycles")
    try:
        rows, projects = views.cycle_list(_stores(request), **filters)
    except NotFound as exc:
        return _from_exception(request, viewer, exc)
    states = (*cycles.LIVE, *cycles.WAITING, *cycles.TERMINAL)
    return render(
        request,
        "cycles.html",
        viewer,
        rows=rows,
        projects=projects,
        filters=filters,
        states=states,
        live=any(r.cycle.state in cycles.LIVE for r in rows),
        live_topic="cycles",
        live_version=version,
    )


@dashboard_router.get(PREFIX + "/queue")
def gpu_queue(request: Request) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    version = live.version(_stores(request), "queue")
    page = views.gpu_queue(_settings(request), _stores(request))
    return render(
        request,
        "gpu_queue.html",
        viewer,
        page=page,
        live=True,
        live_topic="queue",
        live_version=version,
    )


@dashboard_router.get(PREFIX + "/live/{topic}")
def live_stream(
    request: Request,
    topic: str,
    since: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Server-sent events: `changed` whenever what `topic`'s pages show has moved on."""
    viewer = _viewer(request)
    if viewer is None:
        return Response("sign in first", status_code=401, media_type="text/plain")
    if topic not in live.TOPICS:
        known = ", ".join(sorted(live.TOPICS))
        return Response(
            f"no live topic {topic!r}; one of {known}", status_code=404, media_type="text/plain"
        )
    last = request.headers.get("last-event-id", "")[:64] or since
    return StreamingResponse(
        live.stream(_stores(request), topic, last, request.is_disconnected),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# -- research memory ----------------------------------------------------------------------------


@dashboard_router.get(PREFIX + "/memory")
def memory_search(
    request: Request,
    q: Annotated[str, Query(max_length=500)] = "",
    project: str | None = None,
    kind: str | None = None,
    status: str | None = None,
    device: str | None = None,
    offset: Annotated[int, Query(ge=0, le=10_000)] = 0,
) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    filters = {
        "project": _filter(project),
        "kind": _filter(kind),
        "status": _filter(status),
        "device": _filter(device),
    }
    error = None
    results = None
    with _stores(request).memory_session() as session:
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
    with _stores(request).ops_session() as session:
        projects = sorted(views.project_names(session).values())
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


@dashboard_router.get(PREFIX + "/memory/{finding_id}")
def finding_detail(request: Request, finding_id: str) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_login(request)
    with _stores(request).memory_session() as session:
        try:
            finding = memory.detail(session, finding_id)
        except AutopilotError as exc:
            return _from_exception(request, viewer, exc)
    cycle_link = None
    if finding.evidence.cycle_id and finding.evidence.cycle_id.isdigit():
        cycle_link = f"{PREFIX}/cycles/{quote(finding.evidence.cycle_id)}"
    return render(request, "finding.html", viewer, f=finding, cycle_link=cycle_link)
