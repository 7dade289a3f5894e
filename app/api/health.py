"""Liveness and readiness: `/healthz` says the process is up, `/readyz` that what it needs is."""

from __future__ import annotations

import os
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import SettingsDep, StoresDep
from app.api.problems import problem_response
from app.errors import PROBLEM_BASE
from app.settings import Settings

router = APIRouter(tags=["health"])


def broker_problem(settings: Settings) -> str | None:
    """None when the broker is reachable, else a short reason."""
    url = settings.broker_url
    if url.startswith("filesystem://"):
        folder = settings.broker_dir
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"broker folder {folder} cannot be created ({exc.strerror})"
        if not os.access(folder, os.W_OK):
            return f"broker folder {folder} is not writable"
        return None
    if url.startswith(("redis://", "rediss://")):
        import redis

        try:
            redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2).ping()
        except Exception as exc:  # any client error means "not ready"
            return type(exc).__name__
        return None
    return None


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=None)
def readyz(
    stores: StoresDep,
    settings: SettingsDep,
) -> dict[str, Any] | JSONResponse:
    checks: dict[str, str | None] = {**stores.check(), "broker": broker_problem(settings)}
    failing = {name: reason for name, reason in checks.items() if reason}
    if failing:
        return problem_response(
            {
                "type": PROBLEM_BASE + "not-ready",
                "title": "Not ready",
                "status": 503,
                "detail": "unreachable: "
                + ", ".join(f"{name} ({reason})" for name, reason in failing.items()),
                "checks": {name: reason or "ok" for name, reason in checks.items()},
            },
            {"Retry-After": "5"},
        )
    return {"status": "ready", "checks": {name: "ok" for name in checks}}
