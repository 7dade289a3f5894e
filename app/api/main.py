"""The FastAPI application: health, the versioned REST API, the dashboard."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app import broker
from app.api import health, openapi, problems
from app.api.limits import GIT_REQUEST_BYTES, IMPORT_FORM_BYTES, BodySizeLimit
from app.api.metrics import metrics_router
from app.api.request_metrics import RequestMetrics
from app.cycles.campaigns.router import router as campaigns_router
from app.cycles.router import autopilot_router
from app.cycles.router import router as cycles_router
from app.dashboard.router import dashboard_router
from app.db import Stores
from app.forge.local import HTTP_PREFIX
from app.forge.router import router as forge_http_router
from app.forge.webhooks import MAX_WEBHOOK_BYTES
from app.forge.webhooks import ROUTE as WEBHOOK_ROUTE
from app.forge.webhooks import router as webhooks_router
from app.jobs import router as jobs_router_module
from app.jobs.router import router as jobs_router
from app.memory.exchange import MAX_IMPORT_BYTES
from app.memory.router import router as memory_router
from app.projects.router import router as projects_router
from app.settings import Settings, get_settings

API_PREFIX = "/api/v1"


def create_app(settings: Settings | None = None, stores: Stores | None = None) -> FastAPI:
    settings = settings or get_settings()
    owned = stores is None
    stores = stores or Stores.from_settings(settings)

    doorbell = broker.Coalescer(functools.partial(broker.ring_advance_many, settings))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        doorbell.close()  # what is pending is sent before the process ends
        if owned:
            stores.dispose()

    app = FastAPI(
        title="Research Autopilot",
        version="0.1.0",
        description="Autonomous research cycles on GPU and ML-systems code.",
        lifespan=lifespan,
        generate_unique_id_function=openapi.operation_id,
    )
    app.state.settings = settings
    app.state.stores = stores
    app.state.doorbell = doorbell
    problems.install(app)
    openapi.install(app)
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        # Only the routes that need a large body get one: a 1 MiB cap elsewhere keeps a
        # flood of large bodies from holding the API's memory.
        routes={
            API_PREFIX + jobs_router_module.LOG_ROUTE_PATTERN: settings.max_job_log_bytes,
            "/api/v1/memory/import": MAX_IMPORT_BYTES + IMPORT_FORM_BYTES,
            HTTP_PREFIX + "/.*": GIT_REQUEST_BYTES,
            API_PREFIX + WEBHOOK_ROUTE: MAX_WEBHOOK_BYTES,
        },
    )
    app.add_middleware(RequestMetrics)
    if settings.cors_origins:  # CORS stays off unless configured
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        )
    # The router tries routes in order: the API first, the trigger route's router first in it
    # (the busiest route matches on its first candidates). No two prefixes overlap.
    api = APIRouter(prefix=API_PREFIX)
    api.include_router(cycles_router)
    api.include_router(projects_router)
    api.include_router(memory_router)
    api.include_router(jobs_router)
    api.include_router(campaigns_router)
    api.include_router(autopilot_router)
    api.include_router(webhooks_router)  # GitHub's deliveries: signed, no bearer token
    app.include_router(api)
    app.include_router(health.router)
    app.include_router(metrics_router)  # /metrics, public like /healthz
    app.include_router(dashboard_router)  # /dashboard/*, and / redirects there
    app.include_router(forge_http_router)  # /git/<project>.git/*: the local forge, read-only
    return app
