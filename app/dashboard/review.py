"""The review pages: the queue of PRs awaiting a decision, a PR's detail with its evidence and
plot and the decision form (approve or reject, with a note and an optional merge), and the
cycle's whole report.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import SettingsDep, StoresDep
from app.cycles import review as cycle_review
from app.cycles import states
from app.dashboard import auth, evidence, live, views
from app.dashboard.auth import PREFIX
from app.dashboard.pages import (
    MaybeViewer,
    clean_filter,
    error,
    from_exception,
    render,
    to_login,
)
from app.db import Stores
from app.errors import AutopilotError, Conflict, InvalidInput, NotFound
from app.settings import Settings

# An SVG opened directly must not run anything: no scripts, no loads, sandboxed.
SVG_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"
MAX_NOTE_CHARS = 10_000

router = APIRouter(include_in_schema=False)


@router.get(PREFIX + "/")
def review_queue(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    project: str | None = None,
    verdict: str | None = None,
    state: str | None = None,
) -> Response:
    if viewer is None:
        return to_login(request)
    filters = {
        "project": clean_filter(project),
        "verdict": clean_filter(verdict),
        "state": clean_filter(state),
    }
    version = live.version(stores, "cycles")
    try:
        waiting, decided, projects = views.review_queue(stores, **filters)
    except NotFound as exc:
        return from_exception(request, viewer, exc)
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
    stores: Stores,
    settings: Settings,
    cycle_id: int,
    *,
    status_code: int = 200,
    error: str | None = None,
    note: str = "",
    done: str | None = None,
) -> Response:
    version = live.version(stores, "cycles")
    try:
        page = views.cycle_page(settings, stores, cycle_id)
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
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
        forge=settings.forge,
        live=page.cycle.state in states.LIVE,
        live_topic="cycles" if page.cycle.state in states.LIVE else None,
        live_version=version,
    )


@router.get(PREFIX + "/cycles/{cycle_id}")
def cycle_detail(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    cycle_id: int,
    done: str | None = None,
) -> Response:
    if viewer is None:
        return to_login(request)
    return _cycle_page(
        request,
        viewer,
        stores,
        settings,
        cycle_id,
        done=done if done in ("approved", "rejected") else None,
    )


@router.get(PREFIX + "/cycles/{cycle_id}/report")
def cycle_report(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    cycle_id: int,
) -> Response:
    """The whole report, one click from the review page, which shows each of its facts once."""
    if viewer is None:
        return to_login(request)
    try:
        page = views.report_page(settings, stores, cycle_id, f"{PREFIX}/cycles/{cycle_id}/plot.svg")
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
    return render(request, "report.html", viewer, page=page, c=page.cycle)


@router.get(PREFIX + "/cycles/{cycle_id}/plot.svg")
def cycle_plot(
    viewer: MaybeViewer, stores: StoresDep, settings: SettingsDep, cycle_id: int
) -> Response:
    if viewer is None:
        return Response("sign in first", status_code=401, media_type="text/plain")
    try:
        cycle, ref = views.cycle_and_project(stores, cycle_id)
    except NotFound:
        return Response("no such cycle", status_code=404, media_type="text/plain")
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


@router.post(PREFIX + "/cycles/{cycle_id}/review")
def decide(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    cycle_id: int,
    decision: Annotated[str, Form(max_length=16)] = "",
    note: Annotated[str, Form()] = "",
    merge: Annotated[str | None, Form(max_length=8)] = None,
    csrf_token: Annotated[str, Form(max_length=256)] = "",
) -> Response:
    if viewer is None:
        return error(
            request, None, 401, "Not signed in", "Your session ended. Sign in and decide again."
        )
    if not auth.same_origin(request) or not auth.check_csrf(viewer, csrf_token):
        return error(
            request,
            viewer,
            403,
            "Form expired",
            "The decision form was not sent from this page or has expired. Reload the PR and "
            "decide again; nothing was changed.",
        )
    if not viewer.can("review"):
        return error(
            request,
            viewer,
            403,
            "Not allowed",
            f"Deciding needs a token with scope 'review'; {viewer.name!r} has "
            f"{', '.join(viewer.scopes) or 'none'}. Sign in with a review token.",
        )
    # The form again, with what was wrong and the note as typed.
    form_again = partial(_cycle_page, request, viewer, stores, settings, cycle_id)
    if decision not in ("approve", "reject"):
        return form_again(status_code=422, error="Choose approve or reject.", note=note)
    if len(note) > MAX_NOTE_CHARS:
        return form_again(
            status_code=422,
            error=f"The note is longer than {MAX_NOTE_CHARS} characters.",
            note=note[:MAX_NOTE_CHARS],
        )
    try:
        cycle_review.review(
            stores,
            settings,
            cycle_id,
            approve=decision == "approve",
            note=note,
            actor=viewer.name,
            merge=decision == "approve" and merge is not None,
        )
    except (InvalidInput, Conflict) as exc:
        return form_again(status_code=exc.status, error=exc.detail, note=note)
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
    done = "approved" if decision == "approve" else "rejected"
    return RedirectResponse(f"{PREFIX}/cycles/{cycle_id}?done={done}", status_code=303)
