"""How a dashboard page is answered: its templates, its security headers, who is looking (a
request dependency), an error page, and the way back to the sign-in form.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from app import clock
from app.api.deps import StoresDep, get_stores
from app.dashboard import auth, evidence, live, views
from app.errors import AutopilotError
from app.memory.models import KINDS, STATUSES

HERE = Path(__file__).parent
PAGE_CSP = (
    "default-src 'none'; img-src 'self'; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

templates = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(("html",), default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["age"] = clock.age
templates.filters["ratio"] = views.ratio_text
templates.filters["accuracy"] = views.accuracy_text
templates.filters["inline"] = evidence.render_inline
templates.globals.update(
    prefix=auth.PREFIX,
    duration=views.duration,
    unverified=views.unverified,
    verdicts=views.VERDICTS,
    review_states=views.REVIEW_STATES,
    kinds=KINDS,
    statuses=STATUSES,
)


def current_viewer(request: Request, stores: StoresDep) -> auth.Viewer | None:
    """The signed-in viewer, or None (each page decides what that means for it)."""
    return auth.current_viewer(stores, request)


MaybeViewer = Annotated[auth.Viewer | None, Depends(current_viewer)]


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
        context["live_url"] = f"{auth.PREFIX}/live/{topic}"
        context.setdefault("live_version", live.version(get_stores(request), topic))
    else:
        context.pop("live_version", None)
    html = templates.get_template(name).render(
        request_path=request.url.path, viewer=viewer, **context
    )
    response = HTMLResponse(html, status_code=status_code)
    _secure(response)
    return response


def error(
    request: Request, viewer: auth.Viewer | None, status_code: int, title: str, detail: str
) -> HTMLResponse:
    return render(
        request, "error.html", viewer, status_code=status_code, title=title, detail=detail
    )


def from_exception(request: Request, viewer: auth.Viewer | None, exc: AutopilotError) -> Response:
    return error(request, viewer, exc.status, exc.title, exc.detail)


def to_login(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{auth.PREFIX}/login?{urlencode({'next': target})}", status_code=303)


def clean_filter(value: str | None) -> str | None:
    return value.strip() or None if value else None
