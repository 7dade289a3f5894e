"""Shared fixtures: real stores on SQLite and, when configured, on PostgreSQL; real Redis.

PostgreSQL and Redis tests run when AUTOPILOT_TEST_POSTGRES_URL / AUTOPILOT_TEST_REDIS_URL are
set and skip with the reason otherwise. In CI (AUTOPILOT_TEST_REQUIRE_SERVICES=1) an unreachable
server is an error, never a skip.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from app import migrate
from app.db import Stores
from app.settings import Settings

POSTGRES_URL = os.environ.get("AUTOPILOT_TEST_POSTGRES_URL")
REDIS_URL = os.environ.get("AUTOPILOT_TEST_REDIS_URL")
REQUIRE_SERVICES = os.environ.get("AUTOPILOT_TEST_REQUIRE_SERVICES") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    if not REQUIRE_SERVICES:
        return
    missing = [n for n, v in (("POSTGRES", POSTGRES_URL), ("REDIS", REDIS_URL)) if not v]
    if missing:
        raise pytest.UsageError(f"CI needs AUTOPILOT_TEST_{missing[0]}_URL")
    _postgres_admin_engine().connect().close()
    import redis

    redis.Redis.from_url(REDIS_URL or "", socket_connect_timeout=3).ping()


def _postgres_admin_engine():  # type: ignore[no-untyped-def]
    return create_engine(POSTGRES_URL or "", isolation_level="AUTOCOMMIT", pool_pre_ping=True)


def need_postgres() -> str:
    if not POSTGRES_URL:
        pytest.skip("AUTOPILOT_TEST_POSTGRES_URL is not set (CI sets it)")
    return POSTGRES_URL


def need_redis() -> str:
    if not REDIS_URL:
        pytest.skip("AUTOPILOT_TEST_REDIS_URL is not set (CI sets it)")
    return REDIS_URL


@dataclass
class Backend:
    name: str
    memory_url: str
    ops_url: str


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Empty memory and ops databases of one kind; PostgreSQL ones are created and dropped."""
    if request.param == "sqlite":
        yield Backend(
            "sqlite", f"sqlite:///{tmp_path / 'memory.db'}", f"sqlite:///{tmp_path / 'ops.db'}"
        )
        return
    base = make_url(need_postgres())
    suffix = uuid.uuid4().hex[:10]
    names = {"memory": f"ap_test_memory_{suffix}", "ops": f"ap_test_ops_{suffix}"}
    admin = _postgres_admin_engine()
    with admin.connect() as connection:
        for name in names.values():
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield Backend(
            "postgres",
            base.set(database=names["memory"]).render_as_string(hide_password=False),
            base.set(database=names["ops"]).render_as_string(hide_password=False),
        )
    finally:
        with admin.connect() as connection:
            for name in names.values():
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def settings(backend: Backend, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        memory_url=backend.memory_url,
        ops_url=backend.ops_url,
    )


@pytest.fixture
def stores(settings: Settings) -> Iterator[Stores]:
    """Both stores migrated to head."""
    migrate.upgrade(settings)
    stores = Stores.from_settings(settings)
    yield stores
    stores.dispose()


@pytest.fixture
def queue_sandbox() -> str:
    """AUTOPILOT_SANDBOX of the real workers that the queue, reliability and e2e tests start:
    off, as they watch a job's processes by host pid and its files beside its export (runs.txt
    counts attempts across re-exports), which the sandbox hides on purpose.
    tests/integration/containment overrides it: there the same workers run sandboxed."""
    return "off"
