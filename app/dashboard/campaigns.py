"""Research campaigns on the dashboard (docs/design.md, "Research lines"): a list, and one
campaign's page with its line (branch, start, tip), each step with what became of it and why,
the cumulative result and its pull request, and the form that stops it. Live pages (`live.py`,
topic `cycles`, which follows live campaigns too).
"""

from __future__ import annotations

import logging
from typing import Annotated, get_args

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app import broker
from app.api.deps import SettingsDep, StoresDep
from app.cycles.campaigns import service as campaigns
from app.cycles.campaigns.schemas import CampaignOut, CampaignState
from app.dashboard import auth, live
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
from app.errors import AutopilotError, Conflict, NotFound
from app.projects import service as ops
from app.settings import Settings

log = logging.getLogger(__name__)
router = APIRouter(include_in_schema=False)

STATES = get_args(CampaignState)
LIVE = live.CAMPAIGN_LIVE


def campaign_list(
    stores: Stores, *, project: str | None = None, state: str | None = None
) -> tuple[list[CampaignOut], list[str]]:
    """Campaigns, newest first, and every project's name; ProjectNotFound names a wrong one."""
    with stores.ops_session() as session:
        rows = [
            campaigns.out(session, c)
            for c in campaigns.list_campaigns(session, project=project, state=state)
        ]
        names = sorted(ops.project_names(session).values())
    return rows, names


def campaign_page(stores: Stores, campaign_id: int) -> CampaignOut:
    """One campaign with its steps; CampaignNotFound when there is none."""
    with stores.ops_session() as session:
        return campaigns.out(session, campaigns.get(session, campaign_id))


@router.get(PREFIX + "/campaigns")
def campaign_list_page(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    project: str | None = None,
    state: str | None = None,
) -> Response:
    if viewer is None:
        return to_login(request)
    filters = {"project": clean_filter(project), "state": clean_filter(state)}
    version = live.version(stores, "cycles")  # read before the data: a change between is seen
    try:
        rows, projects = campaign_list(stores, **filters)
    except NotFound as exc:
        return from_exception(request, viewer, exc)
    return render(
        request,
        "campaigns.html",
        viewer,
        rows=rows,
        projects=projects,
        filters=filters,
        states=STATES,
        live_states=LIVE,
        live=any(r.state in LIVE for r in rows),
        live_topic="cycles",
        live_version=version,
    )


def _campaign(
    request: Request,
    viewer: auth.Viewer,
    stores: Stores,
    settings: Settings,
    campaign_id: int,
    *,
    status_code: int = 200,
    error: str | None = None,
    done: str | None = None,
) -> Response:
    version = live.version(stores, "cycles")
    try:
        c = campaign_page(stores, campaign_id)
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
    running = c.state in LIVE
    return render(
        request,
        "campaign.html",
        viewer,
        status_code=status_code,
        c=c,
        error=error,
        done=done,
        forge=settings.forge,
        live=running,
        live_topic="cycles" if running else None,
        live_version=version,
    )


@router.get(PREFIX + "/campaigns/{campaign_id}")
def campaign_detail(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    campaign_id: int,
    done: str | None = None,
) -> Response:
    if viewer is None:
        return to_login(request)
    shown = done if done == "stopped" else None
    return _campaign(request, viewer, stores, settings, campaign_id, done=shown)


@router.post(PREFIX + "/campaigns/{campaign_id}/stop")
def stop(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    settings: SettingsDep,
    campaign_id: int,
    csrf_token: Annotated[str, Form(max_length=256)] = "",
) -> Response:
    if viewer is None:
        return error(
            request, None, 401, "Not signed in", "Your session ended. Sign in and stop it again."
        )
    if not auth.same_origin(request) or not auth.check_csrf(viewer, csrf_token):
        return error(
            request,
            viewer,
            403,
            "Form expired",
            "The stop form was not sent from this page or has expired. Reload the campaign and "
            "stop it again; nothing was changed.",
        )
    if not viewer.can("trigger"):
        return error(
            request,
            viewer,
            403,
            "Not allowed",
            f"Stopping a campaign needs a token with scope 'trigger'; {viewer.name!r} has "
            f"{', '.join(viewer.scopes) or 'none'}. Sign in with a trigger token.",
        )
    try:
        with stores.ops_session() as session:
            campaigns.stop(session, campaign_id, viewer.name)
    except Conflict as exc:  # it has ended meanwhile: the page says so, as it is now
        return _campaign(
            request, viewer, stores, settings, campaign_id, status_code=exc.status, error=exc.detail
        )
    except AutopilotError as exc:
        return from_exception(request, viewer, exc)
    try:  # after the commit: the doorbell names a campaign that is asked to stop
        broker.ring_campaign(settings, campaign_id)
    except Exception:  # the request is stored; the reaper rings a campaign nothing moved
        log.warning("campaign %s: stop stored, its doorbell not sent", campaign_id, exc_info=True)
    return RedirectResponse(f"{PREFIX}/campaigns/{campaign_id}?done=stopped", status_code=303)
