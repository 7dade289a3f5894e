"""Both stores migrated once per test session, and each test's stores copied from them.

A full Alembic migration per test (and per stack) was most of a DB fixture's cost; a copy is
not. SQLite: the migrated files are copied. PostgreSQL: `CREATE DATABASE ... TEMPLATE` clones
the migrated template databases (one pair per session and xdist worker: PostgreSQL refuses to
clone a template another session is connected to).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from app import migrate
from app.settings import Settings

STORES = ("memory", "ops")


class Templates:
    """The session's migrated stores: SQLite files under `root`, PostgreSQL template databases
    on the server of `postgres_url` (made on first use, dropped by `drop`)."""

    def __init__(self, root: Path, postgres_url: str | None, worker: str) -> None:
        self.root = root
        self.postgres_url = postgres_url
        self.prefix = f"ap_test_{worker}_{os.getpid()}"
        self._sqlite: dict[str, Path] | None = None
        self._postgres: dict[str, str] | None = None
        self._admin: Engine | None = None

    # -- SQLite ----------------------------------------------------------------------------

    def sqlite(self, folder: Path, *, migrated: bool) -> tuple[str, str]:
        """The URLs of a memory and an ops database in `folder`: copies of the migrated
        template when `migrated`, else not yet made (empty)."""
        paths = {store: folder / f"{store}.db" for store in STORES}
        if migrated:
            for store, template in self._sqlite_templates().items():
                shutil.copyfile(template, paths[store])
        return f"sqlite:///{paths['memory']}", f"sqlite:///{paths['ops']}"

    def _sqlite_templates(self) -> dict[str, Path]:
        if self._sqlite is None:
            paths = {store: self.root / f"{store}.db" for store in STORES}
            migrate.upgrade(_settings(self.root, {s: f"sqlite:///{p}" for s, p in paths.items()}))
            for path in paths.values():  # everything in the main file: no -wal to copy along
                with contextlib.closing(sqlite3.connect(path)) as connection:
                    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._sqlite = paths
        return self._sqlite

    # -- PostgreSQL ------------------------------------------------------------------------

    @contextlib.contextmanager
    def postgres(self, *, migrated: bool) -> Iterator[tuple[str, str]]:
        """A memory and an ops database of their own, clones of the templates when `migrated`
        (else empty), dropped on exit."""
        assert self.postgres_url is not None
        suffix = uuid.uuid4().hex[:10]
        names = {store: f"ap_test_{store}_{suffix}" for store in STORES}
        templates = self._postgres_templates() if migrated else {}
        with self._admin_engine().connect() as connection:
            for store, name in names.items():
                clone = f' TEMPLATE "{templates[store]}"' if migrated else ""
                connection.execute(text(f'CREATE DATABASE "{name}"{clone}'))
        try:
            yield self._url(names["memory"]), self._url(names["ops"])
        finally:
            self._drop(names.values())

    def _postgres_templates(self) -> dict[str, str]:
        if self._postgres is None:
            names = {store: f"{self.prefix}_tmpl_{store}" for store in STORES}
            self._drop(names.values())
            with self._admin_engine().connect() as connection:
                for name in names.values():
                    connection.execute(text(f'CREATE DATABASE "{name}"'))
            migrate.upgrade(_settings(self.root, {s: self._url(n) for s, n in names.items()}))
            self._postgres = names
        return self._postgres

    def drop(self) -> None:
        if self._postgres is not None:
            self._drop(self._postgres.values())
            self._postgres = None
        if self._admin is not None:
            self._admin.dispose()

    def _drop(self, names: object) -> None:
        with self._admin_engine().connect() as connection:
            for name in names:  # type: ignore[attr-defined]
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def _admin_engine(self) -> Engine:
        if self._admin is None:
            assert self.postgres_url is not None
            self._admin = create_engine(
                self.postgres_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True
            )
        return self._admin

    def _url(self, database: str) -> str:
        assert self.postgres_url is not None
        return (
            make_url(self.postgres_url).set(database=database).render_as_string(hide_password=False)
        )


def _settings(state_dir: Path, urls: dict[str, str]) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=state_dir / "state",
        memory_url=urls["memory"],
        ops_url=urls["ops"],
    )
