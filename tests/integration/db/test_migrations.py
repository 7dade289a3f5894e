"""Both Alembic environments: up, down to base, up again; models match; the stores stay apart."""

from __future__ import annotations

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text

import app.tables  # noqa: F401  (every model registered)
from app import migrate
from app.db import OpsBase, Stores, make_engine
from app.jobs import reservations
from app.memory.models import MemoryBase, include_object, is_search_index
from app.settings import Settings
from tests.integration.queue.test_jobs_service import lease, make_project, submit

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


def migrate_ops(settings: Settings, action: str, revision: str) -> None:
    """Alembic's `action` to `revision` on the ops store alone (`migrate` moves both)."""
    config = migrate.alembic_config("ops", settings.ops_database_url)
    engine = make_engine(settings.ops_database_url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            getattr(command, action)(config, revision)
    finally:
        engine.dispose()


def job_states(stores: Stores) -> dict[int, str]:
    with stores.ops_engine.connect() as connection:
        return {i: s for i, s in connection.execute(text("SELECT id, state FROM job"))}


def test_a_reservation_held_across_the_reserved_state_migration_is_reserved(
    stores: Stores, settings: Settings
) -> None:
    """20261207_job_reserved_state: a job reserved before it (queued, with a lease row) is
    `reserved` after it, so its worker's hand-over still finds it; a queued job without a
    lease stays queued. Its downgrade makes reserved jobs queued again."""
    make_project(stores, "alpha")
    running, reserved, waiting = (submit(stores, settings, "alpha") for _ in range(3))
    assert lease(stores, settings, "w1") == running
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    with stores.ops_session() as session:
        job = reservations.reserve_next(session, at_once, queue="gpu.cpu", worker="w1", device="")
        assert job is not None and job.id == reserved
    migrate_ops(settings, "downgrade", "20261207_campaigns")
    before = {running: "leased", reserved: "queued", waiting: "queued"}
    assert job_states(stores) == before
    migrate_ops(settings, "upgrade", "head")
    assert job_states(stores) == {**before, reserved: "reserved"}


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
