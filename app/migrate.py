"""Alembic for both stores, configured in code: `autopilot db upgrade|downgrade` calls these."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config

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


def upgrade(settings: Settings, revision: str = "head") -> None:
    _run(settings, "upgrade", revision)


def downgrade(settings: Settings, revision: str = "base") -> None:
    _run(settings, "downgrade", revision)
