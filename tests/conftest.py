"""Shared fixtures: real stores on SQLite and, when configured, on PostgreSQL; real Redis.

PostgreSQL and Redis tests run when AUTOPILOT_TEST_POSTGRES_URL / AUTOPILOT_TEST_REDIS_URL are
set and skip with the reason otherwise. In CI (AUTOPILOT_TEST_REQUIRE_SERVICES=1) an unreachable
server is an error, never a skip.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from app import migrate
from app.db import Stores
from app.settings import Settings
from tests.support import leftovers, schemas

POSTGRES_URL = os.environ.get("AUTOPILOT_TEST_POSTGRES_URL")
REQUIRE_SERVICES = os.environ.get("AUTOPILOT_TEST_REQUIRE_SERVICES") == "1"
#: The pytest-xdist worker this process is ("gw0", "gw1", ...; "" without xdist).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _redis_url_of_this_worker(url: str | None) -> str | None:
    """Each xdist worker gets a Redis database of its own (1 + its number), so one worker's
    `flushdb` or queues never touch another's; without xdist, the configured database."""
    if not url or not XDIST_WORKER:
        return url
    number = int(XDIST_WORKER.removeprefix("gw") or 0)
    base, _, _ = url.rpartition("/") if url.count("/") > 2 else (url, "", "")
    return f"{base}/{1 + number % 15}"


REDIS_URL = _redis_url_of_this_worker(os.environ.get("AUTOPILOT_TEST_REDIS_URL"))


def pytest_configure(config: pytest.Config) -> None:
    leftovers.mark_session()  # before xdist starts its workers: they inherit the mark
    config.addinivalue_line(
        "markers",
        "stores(*names): the stacks a test of the `backend` fixture runs on (default: sqlite; "
        "name postgres where PostgreSQL's semantics matter: locks, SKIP LOCKED, concurrency)",
    )
    config.addinivalue_line(
        "markers", "timing: a verdict on measured speed; such tests run one at a time"
    )
    config.addinivalue_line(
        "markers",
        "quiet: a measurement that needs the machine to itself: `make test` runs these alone, "
        "after the parallel run",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests whose verdict rests on measured speed run one after another on one xdist worker
    (`--dist loadgroup`): two of them at once, each with its fleet of workers, drown the
    effects they measure in the noise of a 2-core machine."""
    for item in items:
        if item.get_closest_marker("timing") is not None:
            item.add_marker(pytest.mark.xdist_group("timing"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each test of the `backend` fixture runs once per stack its `stores` marker names;
    SQLite alone when it names none (the behaviour is the same there: it runs once)."""
    if "backend" not in metafunc.fixturenames:
        return
    if any(
        "backend" in getattr(m, "args", ()) for m in metafunc.definition.iter_markers("parametrize")
    ):
        return
    marker = metafunc.definition.get_closest_marker("stores")
    names = marker.args if marker is not None else ("sqlite",)
    metafunc.parametrize("backend", names, indirect=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not REQUIRE_SERVICES:
        return
    missing = [n for n, v in (("POSTGRES", POSTGRES_URL), ("REDIS", REDIS_URL)) if not v]
    if missing:
        raise pytest.UsageError(f"CI needs AUTOPILOT_TEST_{missing[0]}_URL")
    _postgres_admin_engine().connect().close()
    import redis

    redis.Redis.from_url(REDIS_URL or "", socket_connect_timeout=3).ping()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No test leaves a process behind: what this run started and is still alive (found by
    the run's mark in its environment) is named, killed, and fails the run. Checked once, by
    the process that started the run (with xdist, after every worker has ended)."""
    if XDIST_WORKER:
        return
    left = leftovers.kill_left()
    if left:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            "processes left behind by the tests (killed now):\n" + "\n".join(left), red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
    #: Both stores were made from the migrated schema (the test asked for `stores`).
    migrated: bool = False


@pytest.fixture(scope="session")
def schema_templates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemas.Templates]:
    """Both stores migrated once per session (per xdist worker): each test's stores are copies."""
    templates = schemas.Templates(
        tmp_path_factory.mktemp("schema"), POSTGRES_URL, XDIST_WORKER or "main"
    )
    yield templates
    templates.drop()


@pytest.fixture
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, schema_templates: schemas.Templates
) -> Iterator[Backend]:
    """Memory and ops databases of one kind, of their own: migrated copies of the session's
    template when the test uses `stores`, else empty. PostgreSQL ones are dropped after."""
    migrated = "stores" in request.fixturenames
    if request.param == "sqlite":
        urls = schema_templates.sqlite(tmp_path, migrated=migrated)
        yield Backend("sqlite", *urls, migrated=migrated)
        return
    need_postgres()
    with schema_templates.postgres(migrated=migrated) as urls:
        yield Backend("postgres", *urls, migrated=migrated)


@pytest.fixture
def settings(backend: Backend, tmp_path: Path) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        memory_url=backend.memory_url,
        ops_url=backend.ops_url,
    )


@pytest.fixture
def stores(settings: Settings, request: pytest.FixtureRequest) -> Iterator[Stores]:
    """Both stores at head: the backend's migrated copies, or migrated here when the test's
    settings name other databases."""
    backend: Backend | None = (
        request.getfixturevalue("backend") if "backend" in request.fixturenames else None
    )
    copied = (
        backend is not None
        and backend.migrated
        and (settings.memory_database_url, settings.ops_database_url)
        == (backend.memory_url, backend.ops_url)
    )
    if not copied:
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
