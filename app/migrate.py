"""Alembic for both stores, configured in code: `autopilot db upgrade|downgrade` calls these."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.db import make_engine
from app.settings import Settings

Store = Literal["memory", "ops"]
STORES: tuple[Store, ...] = ("memory", "ops")
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(store: Store, url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR / store))
    # A literal '%' in a URL (an encoded password) would break ConfigParser interpolation.
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def store_url(settings: Settings, store: Store) -> str:
    return settings.memory_database_url if store == "memory" else settings.ops_database_url


def _run(settings: Settings, action: str, revision: str) -> None:
    for store in STORES:
        url = store_url(settings, store)
        config = alembic_config(store, url)
        # Our engine (SQLite dir created, WAL and busy timeout set), not one Alembic makes.
        engine = make_engine(url)
        try:
            with engine.begin() as connection:
                config.attributes["connection"] = connection
                getattr(command, action)(config, revision)
        finally:
            engine.dispose()


@dataclass(frozen=True)
class Revision:
    """Where a store's schema stands: the revision it is at (None: never migrated) and the
    heads this code's migrations lead to."""

    current: str | None
    heads: tuple[str, ...]
    known: bool  # the current revision is one of this code's (False: the DB is newer)

    @property
    def at_head(self) -> bool:
        return self.current is not None and self.current in self.heads


def schema_revision(store: Store, url: str) -> Revision:
    """The store's schema revision against this code's migrations; connects, changes nothing.

    A SQLite file that does not exist is reported by the caller: connecting would create it."""
    script = ScriptDirectory.from_config(alembic_config(store, url))
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            current = MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
    known = current is None or current in {r.revision for r in script.walk_revisions()}
    return Revision(current, tuple(script.get_heads()), known)


def upgrade(settings: Settings, revision: str = "head") -> None:
    _run(settings, "upgrade", revision)


def downgrade(settings: Settings, revision: str = "base") -> None:
    _run(settings, "downgrade", revision)


def run_environment(metadata: Any, include_object: Any = None) -> None:
    """The body of both `migrations/*/env.py`: offline SQL or online on the given connection.

    Batch mode lets SQLite alter tables (it copies them); PostgreSQL alters in place."""
    from alembic import context
    from sqlalchemy import engine_from_config, pool

    config = context.config
    options: dict[str, Any] = {
        "target_metadata": metadata,
        "render_as_batch": True,
        "compare_type": True,
        "include_object": include_object,
    }
    if context.is_offline_mode():
        context.configure(
            url=config.get_main_option("sqlalchemy.url"), literal_binds=True, **options
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    connection = config.attributes.get("connection")
    if connection is None:  # the alembic command line: our engine settings from the URL
        engine = engine_from_config(
            config.get_section(config.config_ini_section, {}),
            prefix="sqlalchemy.",
            poolclass=pool.NullPool,
        )
        with engine.connect() as fresh:
            context.configure(connection=fresh, **options)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, **options)
    with context.begin_transaction():
        context.run_migrations()
