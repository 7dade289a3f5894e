"""Alembic for both stores, configured in code: `autopilot db upgrade|downgrade` calls these."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from alembic import command
from alembic.config import Config

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


def upgrade(settings: Settings, revision: str = "head") -> None:
    for store in STORES:
        command.upgrade(alembic_config(store, store_url(settings, store)), revision)


def downgrade(settings: Settings, revision: str = "base") -> None:
    for store in STORES:
        command.downgrade(alembic_config(store, store_url(settings, store)), revision)
