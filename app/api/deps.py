"""Request dependencies: the stores, a per-request session (it owns the transaction), auth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Request, Response
from sqlalchemy.orm import Session

from app.db import Stores
from app.projects import service as ops
from app.projects.models import ApiToken
from app.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_stores(request: Request) -> Stores:
    stores: Stores = request.app.state.stores
    return stores


StoresDep = Annotated[Stores, Depends(get_stores)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def ops_session(stores: StoresDep) -> Iterator[Session]:
    with stores.ops_session() as session:
        yield session


def memory_session(stores: StoresDep) -> Iterator[Session]:
    with stores.memory_session() as session:
        yield session


OpsSession = Annotated[Session, Depends(ops_session)]

# Row ids are 32-bit INTEGER columns: an id beyond that range is invalid input (422), which the
# database would otherwise reject with an out-of-range error (a 500).
MAX_ROW_ID = 2**31 - 1
RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID)]
# OFFSET is a 64-bit integer in PostgreSQL; no listing pages anywhere near this far.
MAX_OFFSET = 1_000_000
MemorySession = Annotated[Session, Depends(memory_session)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def current_token(request: Request, stores: StoresDep) -> ApiToken:
    # Its own short session: authentication must not share the request's unit of work.
    with stores.ops_session() as session:
        token = ops.authenticate(session, bearer_token(request))
        session.expunge(token)
    request.state.token_name = token.name
    return token


def require(scope: str | None) -> Callable[[ApiToken], ApiToken]:
    """A dependency that admits any reading token (scope None: any scope but `worker` alone)
    or one holding `scope`."""

    def check(token: Annotated[ApiToken, Depends(current_token)]) -> ApiToken:
        if scope is not None:
            ops.require_scope(token, scope)
        else:
            ops.require_reader(token)
        return token

    check.__name__ = f"require_{scope or 'token'}"
    return check


AnyToken = Annotated[ApiToken, Depends(require(None))]
TriggerToken = Annotated[ApiToken, Depends(require("trigger"))]
ReviewToken = Annotated[ApiToken, Depends(require("review"))]
AdminToken = Annotated[ApiToken, Depends(require("admin"))]


def page_headers(
    request: Request, response: Response, *, total: int, limit: int, offset: int
) -> None:
    """A list's paging, in headers (the body stays a plain list): `X-Total-Count`, and
    `Link: <next page>; rel="next"` while more remain."""
    response.headers["X-Total-Count"] = str(total)
    if offset + limit < total:
        following = request.url.include_query_params(offset=offset + limit, limit=limit)
        response.headers["Link"] = f'<{following}>; rel="next"'
