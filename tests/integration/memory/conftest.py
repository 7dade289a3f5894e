"""Research memory over real, migrated stores (SQLite and PostgreSQL), and small builders.

Creating and migrating two databases costs about a second on PostgreSQL, so this package
migrates one pair per back end and empties the memory tables (and the tokens) around each
test instead: every test still starts from empty stores.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from app import migrate
from app.api.main import create_app
from app.db import Stores
from app.memory import service
from app.memory.models import Finding, FindingEvent
from app.memory.schemas import FindingCreate
from app.projects import service as ops
from app.projects.models import ApiToken
from app.settings import Settings
from tests.conftest import _postgres_admin_engine, need_postgres

SAMPLE = Path(__file__).parents[2] / "unit" / "memory" / "property-export-sample.txt"


@pytest.fixture(scope="package", params=["sqlite", "postgres"])
def shared_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    state = tmp_path_factory.mktemp("memory-state")
    if request.param == "sqlite":
        yield Settings(
            _env_file=None,  # type: ignore[call-arg]
            state_dir=state,
            memory_url=f"sqlite:///{state / 'memory.db'}",
            ops_url=f"sqlite:///{state / 'ops.db'}",
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
        yield Settings(
            _env_file=None,  # type: ignore[call-arg]
            state_dir=state,
            memory_url=base.set(database=names["memory"]).render_as_string(hide_password=False),
            ops_url=base.set(database=names["ops"]).render_as_string(hide_password=False),
        )
    finally:
        with admin.connect() as connection:
            for name in names.values():
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="package")
def shared_stores(shared_settings: Settings) -> Iterator[Stores]:
    migrate.upgrade(shared_settings)
    stores = Stores.from_settings(shared_settings)
    yield stores
    stores.dispose()


def _empty(stores: Stores) -> None:
    with stores.memory_session() as session:
        session.execute(delete(FindingEvent))
        session.execute(update(Finding).values(supersedes=None))
        session.execute(delete(Finding))
    with stores.ops_session() as session:
        session.execute(delete(ApiToken))


@pytest.fixture
def settings(shared_settings: Settings) -> Settings:
    return shared_settings


@pytest.fixture
def stores(shared_stores: Stores) -> Iterator[Stores]:
    """Both stores migrated, with no findings and no tokens."""
    _empty(shared_stores)
    yield shared_stores
    _empty(shared_stores)


@pytest.fixture
def client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    with TestClient(create_app(settings, stores)) as client:
        yield client


@pytest.fixture
def tokens(stores: Stores) -> dict[str, str]:
    """A live token per scope."""
    with stores.ops_session() as session:
        return {
            s: ops.create_token(session, f"t-{s}", [s])[1] for s in ("trigger", "review", "admin")
        }


@pytest.fixture
def sample_bytes() -> bytes:
    return SAMPLE.read_bytes()


@pytest.fixture
def memory(stores: Stores) -> Iterator[Session]:
    """One unit of work on the memory store, committed at the end of the test."""
    with stores.memory_session() as session:
        yield session


def record(session: Session, statement: str, actor: str = "agent", **fields: Any) -> Finding:
    data = FindingCreate(**{"kind": "lesson", "statement": statement, **fields})
    return service.create(session, data, actor)


def validated(session: Session, statement: str, **fields: Any) -> Finding:
    finding = record(session, statement, **fields)
    return service.validate(session, finding.id, "reviewer")
