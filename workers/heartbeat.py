"""A running job's heartbeat: it renews the job's lease while the job runs, keeps the log's tail
in the ops DB for the control host, and kills the job's process group when cancellation is
asked."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import logs, paths
from app.jobs import service as jobs
from app.settings import Settings
from workers import gang_members


class _Named(Protocol):
    @property
    def name(self) -> str: ...


class RunLoop(Protocol):
    """What a heartbeat needs of its GPU loop (workers/gpu.py)."""

    @property
    def stores(self) -> Stores: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def me(self) -> _Named: ...
    def renew_reservation(self, session: Session) -> None: ...


log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease while the job runs; kills the job's group when cancellation is asked."""

    def __init__(self, loop: RunLoop, job_id: int, *, gang: bool = False) -> None:
        self.loop, self.job_id = loop, job_id
        #: A job of several GPUs led by this worker: each beat checks its members are up.
        self.gang = gang
        self.gang_lost: str | None = None
        self.pgid: int | None = None
        self.spawned_at: float | None = None  # wall clock, set at spawn or hand-over
        self.cancelled = False
        #: A reserved job's start, to record with its first line (`record_start`).
        self.pending_start: Callable[..., None] | None = None
        self._start_lock = threading.Lock()
        self._killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def start(self) -> None:
        """Start beating (idempotent). A GPU worker starts it once the job is handed over:
        a thread's start waits for the thread to be scheduled, which is no work for the gap."""
        if self._thread.ident is None:
            self._thread.start()

    def stop(self, *, wait: bool = True) -> None:
        """Stop beating; without `wait`, the caller goes on and calls `join` later (a GPU
        worker does, once the next job has started: a join waits for the thread to run)."""
        self._stop.set()
        if wait:
            self.join()

    def join(self) -> None:
        if self._thread.ident is not None:
            self._thread.join(timeout=10)

    def record_start(self, **kw: Any) -> bool:
        """Record the job's pending start now, once, whichever thread comes first (its first
        line, its first beat, its end); False when there was none. A failure other than a lost
        lease leaves it pending for the next try."""
        with self._start_lock:
            task, self.pending_start = self.pending_start, None
            if task is None:
                return False
            try:
                task(**kw)
            except jobs.LeaseLost:
                raise
            except Exception:
                self.pending_start = task
                raise
            return True

    def _run(self) -> None:
        interval = self.loop.settings.heartbeat_interval_s
        while not self._stop.wait(interval):
            try:
                self.record_start()
                with self.loop.stores.ops_session() as session:
                    wanted = jobs.heartbeat(
                        session,
                        self.loop.settings,
                        self.job_id,
                        self.loop.me.name,
                        log_tail=logs.tail_text(
                            paths.log_path(self.loop.settings, self.job_id), paths.LOG_TAIL_BYTES
                        ),
                    )
                    self.loop.renew_reservation(session)  # the next job's, if reserved
                    if self.gang and self.gang_lost is None:
                        self.gang_lost = gang_members.check(session, self.job_id, self.loop.me.name)
                        wanted = wanted or self.gang_lost is not None
            except jobs.LeaseLost:
                wanted = True  # someone else owns it now: stop ours
            except Exception:  # a DB hiccup: keep the job, try again next beat
                log.warning("heartbeat of job %s failed", self.job_id, exc_info=True)
                continue
            if wanted:
                self.cancelled = True
            # A cancel seen before the spawn (pgid unknown yet) is acted on at the next beat.
            if self.cancelled and not self._killed and self.pgid is not None:
                self._killed = True
                self._kill()

    def _kill(self) -> None:
        if self.pgid is None:
            return
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(self.pgid, 0)
                except ProcessLookupError:
                    return
                self._stop.wait(0.05)
