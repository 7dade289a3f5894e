"""A running job's heartbeat: a thread that renews the job's lease (and, in the same
transaction, its worker's reservation of the next job) while the job runs, carrying the log's
tail to the ops DB, and stops the job's processes when the renewal says the job is no longer
its worker's to run (cancelled, its lease lost, a member of its gang gone). It records nothing
of the job's start or outcome: the job's own run does (`run.py`)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import logs, paths
from app.jobs import service as jobs
from app.settings import Settings
from workers import gang_members

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease while the job runs; kills the job's group when cancellation is asked."""

    def __init__(
        self,
        stores: Stores,
        settings: Settings,
        worker: str,
        job_id: int,
        *,
        gang: bool = False,
        renew_also: Callable[[Session], None] | None = None,
    ) -> None:
        """`renew_also` renews what else the worker holds in the same transaction (its
        reservation of the next job)."""
        self.stores, self.settings, self.worker, self.job_id = stores, settings, worker, job_id
        self.renew_also = renew_also
        #: A job of several GPUs led by this worker: each beat checks its members are up.
        self.gang = gang
        self.gang_lost: str | None = None
        self.pgid: int | None = None  # the group a cancel kills: the job's, or its run's
        self.cancelled = False
        self._killed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{job_id}", daemon=True)

    def start(self) -> None:
        """Start beating (idempotent). A GPU worker starts it once the job's start is recorded
        (its lease is then the job's): a thread's start waits for the thread to be scheduled,
        which is no work for the GPU's idle gap."""
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

    def _run(self) -> None:
        interval = self.settings.heartbeat_interval_s
        while not self._stop.wait(interval):
            try:
                with self.stores.ops_session() as session:
                    wanted = jobs.heartbeat(
                        session,
                        self.settings,
                        self.job_id,
                        self.worker,
                        log_tail=logs.tail_text(
                            paths.log_path(self.settings, self.job_id), paths.LOG_TAIL_BYTES
                        ),
                    )
                    if self.renew_also is not None:
                        self.renew_also(session)
                    if self.gang and self.gang_lost is None:
                        self.gang_lost = gang_members.check(session, self.job_id, self.worker)
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
