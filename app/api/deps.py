"""Request dependencies: the stores, a per-request session (it owns the transaction), auth."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated

from fastapi import Depends, Path, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.broker import Coalescer
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


def get_doorbell(request: Request) -> Coalescer:
    """The API process's advance doorbell for new cycles (rung after the commit, batched)."""
    doorbell: Coalescer = request.app.state.doorbell
    return doorbell


# The dependencies the routes declare are `async def` where they only read app state: FastAPI
# runs a plain `def` dependency in the thread pool, a hop (and a GIL hand-off) per dependency
# per request. `get_settings` and `get_stores` stay plain for the callers that call them.
async def _settings(request: Request) -> Settings:
    return get_settings(request)


async def _stores(request: Request) -> Stores:
    return get_stores(request)


StoresDep = Annotated[Stores, Depends(_stores)]
SettingsDep = Annotated[Settings, Depends(_settings)]


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


async def current_token(request: Request) -> ApiToken:
    """The request's token: one verified in the last AUTOPILOT_TOKEN_CACHE_S is answered here,
    on the event loop; any other is checked in the thread pool, in its own short session
    (authentication must not share the request's unit of work). Every authenticated request
    runs this: it reads the app state itself rather than through two more dependencies."""
    presented, ttl_s = bearer_token(request), get_settings(request).token_cache_s
    token = ops.recently_verified(presented, ttl_s)
    if token is None:
        token = await run_in_threadpool(
            ops.authenticate_cached, get_stores(request).ops_session, presented, ttl_s
        )
    request.state.token_name = token.name
    return token


def require(scope: str | None) -> Callable[[Request], Awaitable[ApiToken]]:
    """A dependency that admits any reading token (scope None: any scope but `worker` alone)
    or one holding `scope`."""

    # One dependency, not two (the token's, then this check's): every authenticated request
    # pays FastAPI's dependency solving per level.
    async def check(request: Request) -> ApiToken:
        token = await current_token(request)
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
