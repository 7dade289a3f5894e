"""The GPU loop: lease the oldest prepared job of the worker's queue (or take the one reserved
while the last ran), have it run (`run.py`, `JobRun`: launch, supervise, measure, settle), and go
straight on to the next prepared job without waiting for another doorbell; cleanup is batched
after release.

Each job's outcome is stored in the transaction that leases the next job, or that records the
reserved next job's start (`JobRun.settle`): one commit between two jobs instead of two, which is
GPU idle time (bench/handoff.py). Jobs are prepared before any GPU is theirs (`prepare.py`;
docs/design.md, "Preparation stays off the GPU's path"); a job of several GPUs: `gangs.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import gangs, preparation
from app.jobs import service as jobs
from app.settings import Settings
from workers import gang_members, job_trees, log_outbox, prepare
from workers.gpu.launch_settings import LaunchSettingsCache
from workers.gpu.outcomes import OutcomeRecorder
from workers.gpu.reservation import Reservation
from workers.gpu.run import JobRun
from workers.gpu.spares import SparePool
from workers.gpu.tickets import Ticket, WorkerIdentity
from workers.launcher import confine, execstub, runtime
from workers.launcher.spare import SpareSlot
from workers.lease_gate import GATE, LeaseGate, PastDeadline

log = logging.getLogger(__name__)
CLEANUP_BATCH = 8


def release_all(batch: list[runtime.RuntimeDir]) -> None:
    for rt in batch:
        with contextlib.suppress(Exception):
            runtime.release_runtime(rt)


@dataclass
class RunLoop:
    """One GPU worker's loop over its queue."""

    stores: Stores
    settings: Settings
    me: WorkerIdentity
    pending_cleanup: list[runtime.RuntimeDir] = field(default_factory=list)
    #: The worker's parked interpreter; None runs every job cold (in-process callers).
    spares: SpareSlot | None = None
    #: Keep an exec stub (`launcher/execstub.py`) ready for the next cold start: started when
    #: the loop ends and once a job's start is behind it (the Celery worker; not in-process).
    exec_stub: bool = False
    #: Prepares this host's next jobs while the GPU runs one; None prepares only when idle.
    preparer: prepare.Preparer | None = None
    #: Sends finished jobs' logs from the host's outbox (default: this process's sender).
    sender: log_outbox.LogSender | None = None
    #: Whether a job may be taken now: closed by the worker's shutdown, and past its deadline
    #: for a job too long for what is left (`lease_gate.py`).
    gate: LeaseGate = field(default_factory=lambda: GATE)
    #: Clean-ups of the last job (its killed cgroup's removal, its heartbeat's join) kept off
    #: the GPU's idle gap: run once the next job has started, or when the loop ends.
    _after_start: list[Callable[[], None]] = field(default_factory=list)
    pool: SparePool = field(init=False)
    reservation: Reservation = field(init=False)
    recorder: OutcomeRecorder = field(init=False)
    launches: LaunchSettingsCache = field(init=False)

    def __post_init__(self) -> None:
        sender = self.sender or log_outbox.sender_for(self.stores, self.settings)
        self.pool = SparePool(self.settings, self.me, self.spares)
        self.reservation = Reservation(
            self.stores, self.settings, self.me, self.pool, self.pending_cleanup.append, self.gate
        )
        self.recorder = OutcomeRecorder(self.stores, self.settings, self.me.name, sender)
        self.recorder.queue = self.me.queue
        self.launches = LaunchSettingsCache(self.settings)
        confine.configure(self.settings.run_limits)  # every run's cgroup from this worker

    # -- the loop ----------------------------------------------------------------------------

    def run_available(self) -> int:
        """Run prepared jobs until none is left; returns how many ran."""
        ran = 0
        last: JobRun | None = None
        try:
            while (job := self._next_run(last)) is not None:
                last = job
                job.run()
                ran += 1
        finally:
            self.reservation.release()
            self.cleanup()
        self.ready_exec_stub()  # the next doorbell's first job starts from it (not on an error)
        return ran

    def _next_run(self, last: JobRun | None) -> JobRun | None:
        """The next job's run: the one reserved while `last` ran (its start stores `last`'s
        outcome), else the one leased in the transaction that stores it; None when the loop
        ends (with `last`'s outcome stored)."""
        while True:
            reserved = self.reservation.take()
            if reserved is not None:
                return JobRun(self, reserved, previous=last)
            try:
                ticket = last.settle(self._lease_next) if last is not None else self._lease()
            except PastDeadline as exc:  # its lease rolled back; `last` stored alone
                log.info("%s", exc)
                return None
            last = None
            if ticket is not None:
                self._clean_when_due()
                return JobRun(self, ticket)
            if self.gate.draining:
                return None  # shutting down: nothing more is leased, nor prepared for it
            # Nothing this worker may take is ready here: the GPU is idle anyway, so prepare
            # the next job in line now and lease it, with no doorbell.
            if not prepare.for_idle(self.stores, self.settings, self.me.queue, self.me.name):
                return None

    def _lease(self) -> Ticket | None:
        with self.stores.ops_session() as session:
            return self._lease_next(session)

    def _lease_next(self, session: Session) -> Ticket | None:
        if self.gate.draining:
            return None
        job = jobs.lease_next(
            session,
            self.settings,
            queue=self.me.queue,
            worker=self.me.name,
            device=self.me.device,
            host=self.me.host,
            alive=gang_members.alive,
            may_take=self.reservation.may_take_over,
        )
        if job is None:
            return None
        self.gate.check(job.id, job.time_limit_s)  # raises: this transaction rolls back
        jobs.set_current_job(session, self.me.name, job.id)
        devices = gangs.lease_devices(session, job.id) if job.gpus > 1 else None  # its gang's
        return dataclasses.replace(Ticket.of(job), devices=devices)

    def ready_exec_stub(self) -> None:
        """Have a stub wait for the next cold start (an unconfined job's: a sandboxed job starts
        bwrap in a cgroup of its own); off the GPU's path, it spawns and moves a process."""
        if self.exec_stub and self.settings.sandbox != "on":
            execstub.prepare()

    # -- the next job, readied at the running job's first line -----------------------------------

    def ready_next(self, running: Ticket, launch: prepare.LaunchSettings) -> None:
        """The running job's own start is behind it: reserve the next job now, and park its
        interpreter (else for the job first in line, else for one like the running one), and
        stage it."""
        reserved = self.reservation.reserve()
        if not self.pool.parking:
            return
        after, hint = (
            (reserved, self.launches.of_or(reserved, launch))
            if reserved is not None
            else self._next_in_line(running, launch)
        )
        parked = self.pool.park_for(after, hint, known=after.job_id != running.job_id)
        if parked and reserved is not None:
            self.reservation.stage(reserved, hint)

    def _next_in_line(
        self, current: Ticket, launch: prepare.LaunchSettings
    ) -> tuple[Ticket, prepare.LaunchSettings]:
        try:
            with self.stores.ops_session() as session:
                job = jobs.first_waiting(session, self.me.queue, self.me.host)
                ready = preparation.preparation_on(session, job.id, self.me.host) if job else None
                ticket = Ticket.of(job, ready) if job is not None and ready is not None else None
            if ticket is not None:
                return ticket, self.launches.of(ticket)
        except Exception:  # a hint only
            log.debug("could not read the next job in line", exc_info=True)
        return current, launch

    # -- cleanup -------------------------------------------------------------------------------

    def defer(self, task: Callable[[], None]) -> None:
        """Run `task` once the next job has started (or the loop ends): off the idle gap."""
        self._after_start.append(task)

    def run_after_start(self) -> None:
        """The last job's clean-ups (on the loop's thread: a job's start is recorded there)."""
        pending, self._after_start = self._after_start, []
        for task in pending:
            try:
                task()
            except Exception:
                log.warning("a clean-up after the job's start failed", exc_info=True)

    def _clean_when_due(self) -> None:
        if len(self.pending_cleanup) >= CLEANUP_BATCH:
            # Off the GPU's path and after the outcomes are stored: a slow removal never holds
            # a finished job's lease past its TTL.
            batch = self.pending_cleanup[:]
            self.pending_cleanup.clear()  # (the list the reservation discards into: kept, emptied)
            threading.Thread(
                target=self._clean, args=(batch,), name="runtime-cleanup", daemon=True
            ).start()

    def cleanup(self) -> None:
        self.run_after_start()
        batch = self.pending_cleanup[:]
        self.pending_cleanup.clear()
        self._clean(batch)

    def _clean(self, batch: list[runtime.RuntimeDir]) -> None:
        """Finished jobs' runtime dirs, and (every few minutes) their exported trees."""
        release_all(batch)
        job_trees.sweep_in_background(self.stores, self.settings)
