"""The GPU loop: lease the oldest prepared job of the worker's queue (or take the one reserved
while the last ran), run it through the launcher, have its outcome recorded, and go straight on
to the next prepared job without waiting for another doorbell; cleanup is batched after release.

It composes the loop's seams: the next job (`next_job.py`, reserved at the running job's first
line and staged), the parked interpreters (`spares.py`), the outcome recorder (`outcomes.py`,
the one path that finishes a job). Jobs are prepared before any GPU is theirs (`prepare.py`;
docs/design.md, "Preparation stays off the GPU's path"); a job of several GPUs: `gangs.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from sqlalchemy.orm import Session

from app.db import Stores
from app.errors import InvalidInput
from app.jobs import gangs, logs, paths, preparation, reservations
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.redaction import redact_text
from app.settings import Settings
from workers import command_runs, gang_members, job_trees, log_outbox, prepare
from workers.heartbeat import Heartbeat
from workers.launch_settings import LaunchSettingsCache
from workers.launcher import confine, execstub, runner, runtime, staging
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.spare import Spare, SpareSlot
from workers.lease_gate import GATE, LeaseGate, PastDeadline
from workers.next_job import NextJob
from workers.outcomes import OutcomeRecorder, Settle
from workers.spares import SparePool
from workers.tickets import Ticket, WorkerIdentity, first_line_time, job_outcome

__all__ = ["RunLoop", "Settle", "Ticket", "WorkerIdentity", "first_line_time"]

log = logging.getLogger(__name__)
CLEANUP_BATCH = 8


def release_all(batch: list[runtime.RuntimeDir]) -> None:
    for rt in batch:
        with contextlib.suppress(Exception):
            runtime.release_runtime(rt)


@dataclass
class _Launch:
    """What one job is started with: made ready ahead (`staged`), or a spec with perhaps a
    parked interpreter."""

    spec: LaunchSpec
    spare: Spare | None = None
    staged: staging.Staged | None = None
    taken: bool = False  # run_job took it (and the staged job with it)

    def close(self, cleanup: list[runtime.RuntimeDir]) -> None:
        if self.spare is not None:
            self.spare.close()  # no-op once run_job has used it; kills it if never got there
        if self.staged is not None and not self.taken:
            self.staged.abandon()  # run_job never got it (the job's folder failed first)
        cleanup.append(self.spec.runtime)


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
    #: Clean-ups of the last job (its killed cgroup's removal) kept off the GPU's idle gap:
    #: run once the next job has started, or when the loop ends.
    _after_start: list[Callable[[], None]] = field(default_factory=list)
    _loop_thread: int | None = None  # the thread that runs the loop (and its jobs)
    pool: SparePool = field(init=False)
    next: NextJob = field(init=False)
    recorder: OutcomeRecorder = field(init=False)
    launches: LaunchSettingsCache = field(init=False)

    def __post_init__(self) -> None:
        sender = self.sender or log_outbox.sender_for(self.stores, self.settings)
        self.pool = SparePool(self.settings, self.me, self.spares)
        self.next = NextJob(
            self.stores, self.settings, self.me, self.pool, self.pending_cleanup.append, self.gate
        )
        self.recorder = OutcomeRecorder(self.stores, self.settings, self.me.name, sender)
        self.recorder.queue = self.me.queue
        self.launches = LaunchSettingsCache(self.settings)
        confine.configure(self.settings.run_limits)  # every run's cgroup from this worker

    # -- the loop ----------------------------------------------------------------------------

    def run_available(self) -> int:
        """Run prepared jobs until none is left; returns how many ran.

        Each job's outcome is stored in the same transaction that leases the next job (or
        starts the reserved one): one commit between two jobs instead of two, which is GPU
        idle time (bench/handoff.py).
        """
        ran = 0
        done: Settle | None = None
        self._loop_thread = threading.get_ident()
        try:
            while True:
                # (on an error it has stored the outcome itself before raising)
                finished, done = done, None
                reserved = self.next.take()
                if reserved is not None and finished is not None:
                    # The next job was reserved while this one ran: it starts now, and this
                    # one's outcome is stored with its start, off the GPU's idle gap.
                    done = Settle(reserved, self._run_reserved(reserved, finished))
                    ran += 1
                    continue
                try:
                    ticket = self.recorder.record(finished, self._lease_next)
                except PastDeadline as exc:  # its lease rolled back; `finished` stored alone
                    log.info("%s", exc)
                    break
                if ticket is None:
                    if self.gate.draining:
                        break  # shutting down: nothing more is leased, nor prepared for it
                    # Nothing this worker may take is ready here: the GPU is idle anyway, so
                    # prepare the next job in line now and lease it, with no doorbell.
                    if prepare.for_idle(self.stores, self.settings, self.me.queue, self.me.name):
                        continue
                    break
                self._clean_when_due()
                done = Settle(ticket, self.run_one(ticket))
                ran += 1
        finally:
            self.next.release()
            self.cleanup()
        self.ready_exec_stub()  # the next doorbell's first job starts from it (not on an error)
        return ran

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
            may_take=self.next.may_take,
        )
        if job is None:
            return None
        self.gate.check(job.id, job.time_limit_s)  # raises: this transaction rolls back
        jobs.set_current_job(session, self.me.name, job.id)
        devices = gangs.lease_devices(session, job.id) if job.gpus > 1 else None  # its gang's
        return dataclasses.replace(Ticket.of(job), devices=devices)

    def _run_reserved(self, ticket: Ticket, settle: Settle) -> jobs.JobOutcome:
        try:
            return self.run_one(ticket, settle=settle)
        finally:
            if not settle.stored:  # it never started (or failed before its start was recorded)
                self.recorder.record_alone(settle)

    def renew_reservation(self, session: Session) -> None:
        """Called by the running job's heartbeat (same transaction): keep the reservation."""
        self.next.renew(session)

    def ready_exec_stub(self) -> None:
        """Have a stub wait for the next cold start (an unconfined job's: a sandboxed job starts
        bwrap in a cgroup of its own); off the GPU's path, it spawns and moves a process."""
        if self.exec_stub and self.settings.sandbox != "on":
            execstub.prepare()

    # -- a job's start -------------------------------------------------------------------------

    def _started(
        self,
        ticket: Ticket,
        settle: Settle | None,
        pid: int | None,
        pgid: int | None,
        first_line_at: datetime | None = None,
    ) -> None:
        """Record the job's start: with `settle`, in one transaction with the previous job's
        outcome (and its first line, when known: a reserved job's start is recorded then, so
        that no DB work competes with the job's own start-up). A reservation lost or
        cancelled raises LeaseLost (the caller kills what it started); the previous outcome is
        stored on its own then."""
        mark = functools.partial(self._mark_started, ticket, pid, pgid, first_line_at)
        self.recorder.record(settle, mark)
        self.next.started(ticket)
        self._run_after_start()

    def _mark_started(
        self,
        ticket: Ticket,
        pid: int | None,
        pgid: int | None,
        first_line_at: datetime | None,
        session: Session,
    ) -> None:
        if ticket.reserved:
            reservations.start_reserved(session, ticket.job_id, self.me.name, pid, pgid)
        elif pid is not None and pgid is not None:
            jobs.mark_running(session, ticket.job_id, self.me.name, pid, pgid)
        if first_line_at is not None:
            jobs.mark_first_line(session, ticket.job_id, self.me.name, first_line_at)

    def _spawned(
        self, ticket: Ticket, pid: int, pgid: int, beat: Heartbeat, settle: Settle | None
    ) -> None:
        beat.pgid = pgid
        beat.spawned_at = beat.spawned_at or time.time()
        beat.start()
        if ticket.reserved:
            # Recorded with its first line (or its first heartbeat, or its end, if sooner).
            beat.pending_start = functools.partial(self._started, ticket, settle, pid, pgid)
        else:
            self._started(ticket, settle, pid, pgid)

    def _defer(self, task: Callable[[], None]) -> None:
        self._after_start.append(task)

    def _run_after_start(self) -> None:
        """The last job's clean-ups, on the loop's own thread only (a heartbeat thread that
        records a start leaves them to it: one of them joins that very thread)."""
        if self._loop_thread is not None and threading.get_ident() != self._loop_thread:
            return
        pending, self._after_start = self._after_start, []
        for task in pending:
            try:
                task()
            except Exception:
                log.warning("a clean-up after the job's start failed", exc_info=True)

    # -- one job -------------------------------------------------------------------------------

    def run_one(self, ticket: Ticket, settle: Settle | None = None) -> jobs.JobOutcome:
        """Run one leased (or reserved) job; returns its outcome for the loop to record.
        `settle`, the previous job's outcome, is stored with this job's start."""
        log_path = paths.log_path(self.settings, ticket.job_id)
        if ticket.spec.get("kind") == "command":  # the repository's own program, run arm by arm
            return self._command(ticket, settle, log_path)
        try:
            launch_settings = self.launches.of(ticket)
        except (InvalidInput, OSError) as exc:  # its source or config is gone since it was prepared
            return jobs.JobOutcome(
                ended=End.FAILED_START,
                error=redact_text(f"cannot read its launch settings in {ticket.workdir}: {exc}"),
                log_path=str(log_path),
            )
        launch = self._launch_for(ticket, launch_settings)
        try:
            result = self._run_logged(ticket, settle, launch, launch_settings, log_path)
        finally:
            launch.close(self.pending_cleanup)
        result.log_tail = logs.tail_text(log_path, paths.LOG_TAIL_BYTES)
        return result

    def _launch_for(self, ticket: Ticket, launch_settings: prepare.LaunchSettings) -> _Launch:
        staged = self.next.staged_for(ticket)
        if staged is not None:  # made ready while the previous job ran, perhaps started
            return _Launch(staged.job, staged=staged)
        spare, spec = self.pool.launch_spec(ticket, launch_settings)
        return _Launch(spec, spare=spare)

    def _run_logged(
        self,
        ticket: Ticket,
        settle: Settle | None,
        launch: _Launch,
        launch_settings: prepare.LaunchSettings,
        log_path: Path,
    ) -> jobs.JobOutcome:
        """Run the job with its log open; its outcome, from what the runner saw."""
        beat = Heartbeat(self, ticket.job_id, gang=ticket.gpus > 1)
        if launch.staged is not None:
            beat.spawned_at = launch.staged.started_wall  # handed over at the last job's exit
        ran: runner.Outcome | jobs.JobOutcome | None = None
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log_file:
                if self.settings.sandbox != "on":
                    log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
                    log_file.flush()
                ran = self._supervise(ticket, settle, launch, launch_settings, log_file, beat)
                if isinstance(ran, runner.Outcome):
                    self._note_launch(ticket, ran, log_file)
            if not isinstance(ran, runner.Outcome):
                return ran
            result = job_outcome(self.settings, ticket, ran, None, beat.cancelled, log_path)
            if ran.limit is not None and result.ended in (End.COMPLETED, End.FAILED):
                # its cgroup's limit stopped it (a refused fork, an OOM kill): say so first
                result.ended = End.FAILED
                if ran.limit not in (result.error or ""):
                    result.error = ran.limit + (f"; {result.error}" if result.error else "")
            if result.ended is End.COMPLETED and ticket.spec.get("head_vs_base"):
                beat = Heartbeat(
                    self, ticket.job_id, gang=ticket.gpus > 1
                )  # the code changed: base against head too
                result = command_runs.head_vs_base(self.settings, self.me, ticket, result, beat)
            if ticket.spec.get("head_vs_base"):
                self.next.go()  # the device is free only now (see `_supervise`)
            return result
        except OSError as exc:
            # The job's folder cannot be written (its filesystem is full or read-only): record
            # that as the outcome now. Raising would leave the lease to lapse and the job to be
            # retried blind until it failed as "lease expired", with the cause lost.
            return jobs.JobOutcome(
                ended=End.FAILED_START,
                error=f"cannot write the job's files in {log_path.parent}: {exc.strerror or exc}",
                log_path=str(log_path),
                gpu_seconds=ran.duration_s if isinstance(ran, runner.Outcome) else 0.0,
            )

    def _supervise(
        self,
        ticket: Ticket,
        settle: Settle | None,
        launch: _Launch,
        launch_settings: prepare.LaunchSettings,
        log_file: IO[str],
        beat: Heartbeat,
    ) -> runner.Outcome | jobs.JobOutcome:
        """The runner's outcome, or the failure that kept the job from running (its start
        refused, its lease or reservation lost)."""
        on_event = self._event_handler(ticket, launch_settings, log_file, beat)
        log_path = str(paths.log_path(self.settings, ticket.job_id))
        outcome: runner.Outcome | jobs.JobOutcome
        try:
            launch.taken = True
            outcome = runner.run_job(
                launch.spec,
                limits=runner.Limits(
                    timeout_s=ticket.time_limit_s,
                    max_events_total_bytes=self.settings.run_limits.event_bytes,
                ),
                on_event=on_event,
                on_spawn=lambda pid, pgid: self._spawned(ticket, pid, pgid, beat, settle),
                spare=launch.spare,
                deferred=self._defer,
                staged=launch.staged,
                # A job that measures head against base after this run still owns the device
                # until those runs end: its next job starts then (`run_one`), not at this exit.
                on_exit=None if ticket.spec.get("head_vs_base") else self.next.go,
            )
        except LaunchError as exc:
            outcome = jobs.JobOutcome(ended=End.FAILED_START, error=str(exc), log_path=log_path)
        except jobs.LeaseLost as exc:
            outcome = jobs.JobOutcome(ended=End.LEASE_LOST, error=str(exc), log_path=log_path)
        finally:
            beat.stop(wait=False)
            self._defer(beat.join)
        try:
            beat.record_start()  # a reserved job that ended before its first line
        except jobs.LeaseLost as exc:
            outcome = jobs.JobOutcome(ended=End.LEASE_LOST, error=str(exc), log_path=log_path)
        return outcome

    @staticmethod
    def _note_launch(ticket: Ticket, outcome: runner.Outcome, log_file: IO[str]) -> None:
        """How the job started, then its output, in its log."""
        if ticket.reserved:
            log_file.write("[launch] reserved while the previous job ran\n")
        if outcome.launch == "spare":
            log_file.write("[launch] handed to the parked interpreter\n")
        elif outcome.spare_missed:
            log_file.write(f"[launch] started cold: {outcome.spare_missed}\n")
        if outcome.launch == "stub":
            log_file.write(
                f"[launch] started cold by the worker's exec stub, in cgroup "
                f"{outcome.cgroup or '?'}\n"
            )
        log_file.write(outcome.stdout)
        log_file.write(outcome.stderr)
        log_file.write("".join(f"{line}\n" for line in outcome.notes()))

    def _command(self, ticket: Ticket, settle: Settle | None, log_path: Path) -> jobs.JobOutcome:
        if ticket.reserved:
            try:
                self._started(ticket, settle, None, None)
            except jobs.LeaseLost as exc:
                return jobs.JobOutcome(ended=End.LEASE_LOST, error=str(exc), log_path=str(log_path))
        beat = Heartbeat(self, ticket.job_id, gang=ticket.gpus > 1)
        result = command_runs.run_command_job(
            self.stores, self.settings, self.me, ticket, beat, preparer=self.preparer,
            spares=self.spares,
        )  # fmt: skip
        result.log_tail = logs.tail_text(log_path, paths.LOG_TAIL_BYTES)
        return result

    # -- at the job's first line: what follows ---------------------------------------------------

    def _event_handler(
        self, ticket: Ticket, launch: prepare.LaunchSettings, log_file: IO[str], beat: Heartbeat
    ) -> Callable[[dict[str, Any]], None]:
        def on_event(event: dict[str, Any]) -> None:
            kind = event.get("type")
            if kind == "started":
                self._on_first_line(ticket, launch, beat, event.get("at"))
            if kind in ("log", "progress"):
                log_file.write(logs.event_line(event) + "\n")
                log_file.flush()

        return on_event

    def _on_first_line(
        self, ticket: Ticket, launch: prepare.LaunchSettings, beat: Heartbeat, reported: Any
    ) -> None:
        if self.preparer is not None:
            self.preparer.kick()  # the job's start is behind it: prepare what follows
        self._record_first_line(ticket, beat, reported)
        self._ready_next(ticket, launch)
        self.ready_exec_stub()  # after the next job's own start is under way

    def _record_first_line(self, ticket: Ticket, beat: Heartbeat, reported: Any) -> None:
        """The end of the GPU's idle gap; a reserved job's start is recorded with it."""
        at = first_line_time(reported, lower=beat.spawned_at, upper=time.time())
        first_line = datetime.fromtimestamp(at, UTC)
        if not beat.record_start(first_line_at=first_line):
            with self.stores.ops_session() as session:
                jobs.mark_first_line(session, ticket.job_id, self.me.name, first_line)

    def _ready_next(self, ticket: Ticket, launch: prepare.LaunchSettings) -> None:
        """The job's own start is behind it: reserve the next job now, and park its interpreter
        (else for the job first in line, else for one like this one), and stage it; the exec
        stub the job may have used up is replaced for a later cold start."""
        reserved = self.next.reserve()
        if not self.pool.parking:
            return
        after, hint = (
            (reserved, self.launches.of_or(reserved, launch))
            if reserved is not None
            else self._next_in_line(ticket, launch)
        )
        parked = self.pool.park_for(after, hint, known=after.job_id != ticket.job_id)
        if parked and reserved is not None:
            self.next.stage(reserved, hint)

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

    def _clean_when_due(self) -> None:
        if len(self.pending_cleanup) >= CLEANUP_BATCH:
            # Off the GPU's path and after the outcomes are stored: a slow removal never holds
            # a finished job's lease past its TTL.
            batch = self.pending_cleanup[:]
            self.pending_cleanup.clear()  # (the list NextJob discards into: kept, emptied)
            threading.Thread(
                target=self._clean, args=(batch,), name="runtime-cleanup", daemon=True
            ).start()

    def cleanup(self) -> None:
        self._run_after_start()
        batch = self.pending_cleanup[:]
        self.pending_cleanup.clear()
        self._clean(batch)

    def _clean(self, batch: list[runtime.RuntimeDir]) -> None:
        """Finished jobs' runtime dirs, and (every few minutes) their exported trees."""
        release_all(batch)
        job_trees.sweep_in_background(self.stores, self.settings)
