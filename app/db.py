"""The two stores: research memory and operational state, each with its own engine and sessions.

No table, foreign key or import crosses between them (docs/design.md, "Two stores, kept apart").
SQLite gets WAL,
foreign keys and a busy timeout so the API, the workers and the CLI can share one file.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, MetaData, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from app.settings import Settings

T = TypeVar("T")

# Explicit constraint names, so migrations can drop and alter what they created.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

SQLITE_BUSY_TIMEOUT_MS = 15_000
# PostgreSQL connections kept open per engine: as many as the API serves requests at once under
# a burst (20 clients in bench/cycle_overhead.py), so a burst reuses them instead of opening and
# closing an overflow connection per request (each connect forks a server backend). The pool
# only grows on demand (a worker process holds one or two); overflow covers the thread pool.
# SQLite keeps SQLAlchemy's default pool: its writers take turns anyway (`ops_write_session`).
POOL_SIZE, POOL_OVERFLOW = 20, 20


def naming_metadata() -> MetaData:
    return MetaData(naming_convention=NAMING_CONVENTION)


class OpsBase(DeclarativeBase):
    """The ops DB's tables (projects, jobs, cycles, forge records): one metadata, one Alembic
    environment, whichever domain package declares the table."""

    metadata = naming_metadata()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    # WAL with NORMAL sync is durable across process crashes (not power loss), and much faster.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        # Fail fast when the server is gone, so /readyz and the API answer 503 quickly.
        connect_args={"connect_timeout": 5},
    )


def lock_contention(exc: Exception) -> bool:
    """SQLite refused a write because another connection holds or just took the write lock
    (`database is locked`; in WAL mode a transaction that read first may get it at once, which
    no busy timeout waits out). Retrying the unit of work is the remedy."""
    return "database is locked" in str(exc)


@dataclass
class Stores:
    """Both engines and their session factories. One per process (or per test)."""

    memory_engine: Engine
    ops_engine: Engine

    def __post_init__(self) -> None:
        self._memory = sessionmaker(self.memory_engine, expire_on_commit=False)
        self._ops = sessionmaker(self.ops_engine, expire_on_commit=False)
        sqlite = self.ops_engine.dialect.name == "sqlite"
        self._ops_writers: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if sqlite else contextlib.nullcontext()
        )
        # SQLite takes one writer at a time: the API's writes queue for one thread of their own
        # (`run_write`), made at the first write, instead of a pool thread each taking turns
        # on `_ops_writers`.
        self._sqlite_writer: ThreadPoolExecutor | None = None
        self._sqlite = sqlite

    @classmethod
    def from_settings(cls, settings: Settings) -> Stores:
        return cls(
            memory_engine=make_engine(settings.memory_database_url),
            ops_engine=make_engine(settings.ops_database_url),
        )

    @contextlib.contextmanager
    def memory_session(self) -> Iterator[Session]:
        """A unit of work on research memory: commits on success, rolls back on error."""
        with self._memory() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def ops_session(self) -> Iterator[Session]:
        """A unit of work on operational state: commits on success, rolls back on error."""
        with self._ops() as session, session.begin():
            yield session

    @contextlib.contextmanager
    def ops_write_session(self) -> Iterator[Session]:
        """`ops_session` for a short unit of work that writes, under a burst of them (the
        trigger route). On SQLite this process's writers take turns on a lock first: a waiter
        is woken the moment the writer before it commits, where SQLite's busy handler would
        sleep 1 to 100 ms between its retries (the p99 of a burst). Other processes (workers)
        still meet the busy timeout as before. PostgreSQL writers run side by side."""
        with self._ops_writers, self.ops_session() as session:
            yield session

    async def run_write(self, work: Callable[[], T]) -> T:
        """Run `work` (a short unit of work that writes, in `ops_write_session`) off the event
        loop and await its result, errors included. On SQLite the API's writes take turns on
        one thread of their own: a burst of triggers waits in a queue, not as a pool of threads
        handing the lock and the GIL to each other (that cost ~15% of a trigger's CPU under 20
        concurrent clients); on PostgreSQL, in the thread pool, side by side."""
        import asyncio  # the API's alone: workers import this module too

        import anyio.to_thread

        if not self._sqlite:
            return await anyio.to_thread.run_sync(work)
        if self._sqlite_writer is None:
            self._sqlite_writer = ThreadPoolExecutor(1, thread_name_prefix="ops-writer")
        return await asyncio.get_running_loop().run_in_executor(self._sqlite_writer, work)

    def check(self) -> dict[str, str | None]:
        """Each store's reachability: None when fine, else the error's first line."""
        status: dict[str, str | None] = {}
        for name, engine in (("memory", self.memory_engine), ("ops", self.ops_engine)):
            try:
                with engine.connect() as connection:
                    # the dialect's own liveness probe, as the pool's pre-ping uses it
                    dbapi = connection.connection.dbapi_connection
                    if dbapi is None or not engine.dialect.do_ping(dbapi):
                        raise ConnectionError("no answer to the ping")
                status[name] = None
            except Exception as exc:  # any driver error means "not ready"
                status[name] = type(exc).__name__
        return status

    def dispose(self) -> None:
        if self._sqlite_writer is not None:
            self._sqlite_writer.shutdown(wait=True)
            self._sqlite_writer = None
        self.memory_engine.dispose()
        self.ops_engine.dispose()
