"""Signing in to the dashboard with an API token, and signing out (the session is `auth.py`'s)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.api.deps import StoresDep
from app.dashboard import auth
from app.dashboard.auth import PREFIX
from app.dashboard.pages import MaybeViewer, error, render
from app.errors import Unauthorized

router = APIRouter(include_in_schema=False)


@router.get(PREFIX + "/login")
def login_form(request: Request, viewer: MaybeViewer, next: str | None = None) -> Response:
    target = auth.safe_next(next)
    if viewer is not None:
        return RedirectResponse(target, status_code=303)
    csrf = auth.login_csrf(request)
    response = render(request, "login.html", None, next=target, csrf=csrf, error=None)
    auth.set_login_csrf(request, response, csrf)
    return response


@router.post(PREFIX + "/login")
def login(
    request: Request,
    stores: StoresDep,
    token: Annotated[str, Form(max_length=512)] = "",
    csrf_token: Annotated[str, Form(max_length=256)] = "",
    next: Annotated[str, Form(max_length=2048)] = "",
) -> Response:
    target = auth.safe_next(next)
    if not auth.same_origin(request) or not auth.check_login_csrf(request, csrf_token):
        return error(
            request,
            None,
            403,
            "Form expired",
            "The sign-in form was not sent from this dashboard or has expired. "
            "Open the sign-in page again and retry.",
        )
    response = RedirectResponse(target, status_code=303)
    try:
        auth.login(stores, request, response, token)
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


@router.post(PREFIX + "/logout")
def logout(
    request: Request,
    viewer: MaybeViewer,
    stores: StoresDep,
    csrf_token: Annotated[str, Form(max_length=256)] = "",
) -> Response:
    if viewer is not None and (
        not auth.same_origin(request) or not auth.check_csrf(viewer, csrf_token)
    ):
        return error(request, viewer, 403, "Form expired", "Reload the page and sign out again.")
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    auth.logout(stores, request, response)
    return response
