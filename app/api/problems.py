"""One place where errors become RFC 9457 `application/problem+json` responses."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.errors import PROBLEM_BASE, AutopilotError
from app.redaction import redact_text

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger(__name__)


def problem_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=body["status"], media_type=PROBLEM_JSON, headers=headers)


def _domain(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, AutopilotError)
    return problem_response(exc.problem(request.url.path), exc.headers())


def _validation(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = []
    for error in exc.errors():
        location = ".".join(str(p) for p in error["loc"] if p != "body")
        errors.append({"field": location, "message": error["msg"].removeprefix("Value error, ")})
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
    return problem_response(
        {
            "type": PROBLEM_BASE + "invalid-input",
            "title": "Invalid input",
            "status": 422,
            "detail": detail,
            "instance": request.url.path,
            "errors": errors,
        }
    )


def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    slug = {404: "not-found", 405: "method-not-allowed", 413: "too-large"}.get(
        exc.status_code, "http-error"
    )
    return problem_response(
        {
            "type": PROBLEM_BASE + slug,
            "title": str(exc.detail) if exc.status_code != 404 else "Not found",
            "status": exc.status_code,
            "detail": str(exc.detail),
            "instance": request.url.path,
        }
    )


def _store_down(request: Request, exc: Exception) -> JSONResponse:
    # A database that is down or restarting is a 503 the client may retry, not a 500.
    log.warning("store unavailable: %s", redact_text(str(exc).splitlines()[0] if str(exc) else ""))
    return problem_response(
        {
            "type": PROBLEM_BASE + "store-unavailable",
            "title": "Store unavailable",
            "status": 503,
            "detail": "a database is unreachable; retry shortly",
            "instance": request.url.path,
        },
        {"Retry-After": "5"},
    )


def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return problem_response(
        {
            "type": PROBLEM_BASE + "internal",
            "title": "Internal error",
            "status": 500,
            "detail": "an unexpected error happened; it is logged on the server",
            "instance": request.url.path,
        }
    )


def install(app: FastAPI) -> None:
    app.add_exception_handler(AutopilotError, _domain)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(OperationalError, _store_down)
    app.add_exception_handler(InterfaceError, _store_down)
    app.add_exception_handler(Exception, _unexpected)
