"""Both Alembic environments: up, down to base, up again; models match; the stores stay apart."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

import app.tables  # noqa: F401  (every model registered)
from app import migrate
from app.db import OpsBase, Stores, make_engine
from app.memory.models import MemoryBase, include_object, is_search_index
from app.settings import Settings

# Both stacks: each migration runs on both stores' dialects.
pytestmark = pytest.mark.stores("sqlite", "postgres")

MEMORY_TABLES = set(MemoryBase.metadata.tables)
OPS_TABLES = set(OpsBase.metadata.tables)


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        # The memory store's search index (SQLite FTS5 and its shadow tables) is no model's.
        names = set(inspect(engine).get_table_names()) - {"alembic_version"}
        return {name for name in names if not is_search_index(name)}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(settings: Settings) -> None:
    migrate.upgrade(settings)
    assert tables(settings.memory_database_url) == MEMORY_TABLES
    assert tables(settings.ops_database_url) == OPS_TABLES
    migrate.downgrade(settings, "base")
    assert tables(settings.memory_database_url) == set()
    assert tables(settings.ops_database_url) == set()
    migrate.upgrade(settings)
    assert tables(settings.memory_database_url) == MEMORY_TABLES


def test_models_match_migrations(stores: Stores) -> None:
    for engine, metadata in (
        (stores.memory_engine, MemoryBase.metadata),
        (stores.ops_engine, OpsBase.metadata),
    ):
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "include_object": include_object}
            )
            diff = compare_metadata(context, metadata)
        assert diff == [], diff


def test_stores_are_disjoint(stores: Stores, settings: Settings) -> None:
    memory = tables(settings.memory_database_url)
    ops = tables(settings.ops_database_url)
    assert memory and ops
    assert memory.isdisjoint(ops)
    assert not (OPS_TABLES & memory) and not (MEMORY_TABLES & ops)
    # No foreign key points from one store's tables into the other's.
    for metadata, other in ((MemoryBase.metadata, OPS_TABLES), (OpsBase.metadata, MEMORY_TABLES)):
        for table in metadata.tables.values():
            for fk in table.foreign_keys:
                assert fk.column.table.name not in other, fk


def test_sqlite_gets_wal_foreign_keys_and_busy_timeout(tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 5000
    engine.dispose()
