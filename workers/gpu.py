"""The GPU loop: lease the oldest prepared job of the worker's queue, run it through the
launcher, record exactly one outcome, and go straight on to the next prepared job without
waiting for another doorbell; cleanup is batched after release.

Preparation happens before (`prepare.py`, DESIGN.md lesson 3); the parked interpreter for the
next job is `launcher/spare.py`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from app import broker
from app.db import Stores
from app.errors import InvalidInput
from app.jobs import logs, paths, preparation, reservations
from app.jobs import service as jobs
from app.projects import config as project_config
from app.redaction import redact_text
from app.settings import Settings
from workers import command_runs, control_client, job_trees, prepare
from workers.heartbeat import Heartbeat
from workers.launcher import confine, execstub, runner, runtime, staging
from workers.launcher.launch import LaunchError
from workers.launcher.spare import SpareSlot
from workers.next_job import NextJob
from workers.tickets import Ticket, WorkerIdentity, first_line_time, job_outcome

__all__ = ["RunLoop", "Ticket", "WorkerIdentity", "first_line_time"]

log = logging.getLogger(__name__)
CLEANUP_BATCH = 8


def release_all(batch: list[runtime.RuntimeDir]) -> None:
    for rt in batch:
        with contextlib.suppress(Exception):
            runtime.release_runtime(rt)


@dataclass
class RunLoop(NextJob):
    """One GPU worker's loop over its queue (what it does about the next job: NextJob)."""

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
    #: Launch settings read for the job in line and the job running (by source, experiment).
    _launches: dict[tuple[str, str], prepare.LaunchSettings] = field(default_factory=dict)
    #: The job reserved to run next (`reservations.py`), while the current one runs.
    reserved: Ticket | None = None
    #: Set by the heartbeat thread when the reservation was lost or cancelled.
    _reservation_lost: int | None = None
    #: The reserved job, made ready to start (job id, what `runner.run_job` takes).
    _staged: tuple[int, staging.Staged] | None = None
    #: Clean-ups of the last job (its killed cgroup's removal) kept off the GPU's idle gap:
    #: run once the next job has started, or when the loop ends.
    _after_start: list[Callable[[], None]] = field(default_factory=list)
    _loop_thread: int | None = None  # the thread that runs the loop (and its jobs)

    def run_available(self) -> int:
        """Run prepared jobs until none is left; returns how many ran.

        Each job's outcome is stored in the same transaction that leases the next job: one
        commit between two jobs instead of two, which is GPU idle time (bench/handoff.py).
        """
        ran = 0
        done: tuple[Ticket, jobs.JobOutcome] | None = None
        self._loop_thread = threading.get_ident()
        try:
            while True:
                # (on an error it has stored the outcome itself before raising)
                finished, done = done, None
                reserved = self._take_reservation()
                if reserved is not None and finished is not None:
                    # The next job was reserved while this one ran: it starts now, and this
                    # one's outcome is stored with its start, off the GPU's idle gap.
                    done = (reserved, self._run_reserved(reserved, Settle(*finished)))
                    ran += 1
                    continue
                ticket = self._settle_and_lease(finished)
                if ticket is None:
                    # Nothing is ready on this host: the GPU is idle anyway, so prepare the
                    # first job in line here now (another host may have prepared it already),
                    # and lease it next, with no doorbell to wake another worker for it.
                    if prepare.prepare_ahead(
                        self.stores, self.settings, self.me.queue, want=1, ring=False
                    ):
                        continue
                    break
                if len(self.pending_cleanup) >= CLEANUP_BATCH:
                    # Off the GPU's path and after the outcomes are stored: a slow removal
                    # never holds a finished job's lease past its TTL.
                    batch, self.pending_cleanup = self.pending_cleanup, []
                    threading.Thread(
                        target=self._clean, args=(batch,), name="runtime-cleanup", daemon=True
                    ).start()
                done = (ticket, self.run_one(ticket))
                ran += 1
        finally:
            self._release_reservation()
            self.cleanup()
        self.ready_exec_stub()  # the next doorbell's first job starts from it (not on an error)
        return ran

    def ready_exec_stub(self) -> None:
        """Have a stub wait for the next cold start (an unconfined job's: a sandboxed job starts
        bwrap in a cgroup of its own); off the GPU's path, it spawns and moves a process."""
        if self.exec_stub and self.settings.sandbox != "on":
            execstub.prepare()

    def _run_reserved(self, ticket: Ticket, settle: Settle) -> jobs.JobOutcome:
        try:
            return self.run_one(ticket, settle=settle)
        finally:
            if not settle.stored:  # it never started (or failed before its start was recorded)
                self._store_alone(settle)

    def _store_alone(self, settle: Settle) -> None:
        with self.stores.ops_session() as session:
            cycle_id = self._finish(session, settle.ticket, settle.outcome)
        settle.stored = True
        self._ring(cycle_id)
        self._upload_log(settle.ticket.job_id)

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
        cycle_id: int | None = None
        try:
            with self.stores.ops_session() as session:
                if settle is not None:
                    cycle_id = self._finish(session, settle.ticket, settle.outcome)
                if ticket.reserved:
                    reservations.start_reserved(session, ticket.job_id, self.me.name, pid, pgid)
                elif pid is not None and pgid is not None:
                    jobs.mark_running(session, ticket.job_id, self.me.name, pid, pgid)
                if first_line_at is not None:
                    jobs.mark_first_line(session, ticket.job_id, self.me.name, first_line_at)
        except jobs.LeaseLost:
            if settle is not None:
                self._store_alone(settle)
            raise
        if settle is not None:
            settle.stored = True  # (committed: nothing below may make it pending again)
            self._ring(cycle_id)
            self._upload_log(settle.ticket.job_id)
        self._run_after_start()

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

    def _settle_and_lease(self, done: tuple[Ticket, jobs.JobOutcome] | None) -> Ticket | None:
        """Store the finished job's outcome (if any) and lease the next job, in one transaction.

        Should leasing fail, the outcome is stored on its own before the error propagates:
        a job that ran is never left to lapse and run again.
        """
        cycle_id: int | None = None
        ticket: Ticket | None = None
        try:
            with self.stores.ops_session() as session:
                if done is not None:
                    cycle_id = self._finish(session, *done)
                job = jobs.lease_next(
                    session,
                    self.settings,
                    queue=self.me.queue,
                    worker=self.me.name,
                    device=self.me.device,
                    host=self.me.host,
                )
                if job is not None:
                    jobs.set_current_job(session, self.me.name, job.id)
                    ticket = Ticket.of(job)
        except Exception:
            if done is None:
                raise
            with self.stores.ops_session() as session:
                cycle_id = self._finish(session, *done)
            self._ring(cycle_id)
            raise
        self._ring(cycle_id)
        if done is not None:
            self._upload_log(done[0].job_id)
        return ticket

    def _upload_log(self, job_id: int) -> None:
        """The whole log to the control host, after the outcome is stored and off the GPU's
        path; should it fail, the tail in the DB is what the control host shows."""

        def upload() -> None:
            try:
                control_client.upload_log(
                    self.settings, job_id, paths.log_path(self.settings, job_id)
                )
            except control_client.LogUploadFailed as exc:
                log.warning("%s", exc)

        threading.Thread(target=upload, name=f"log-upload-{job_id}", daemon=True).start()

    def _finish(self, session: Session, ticket: Ticket, result: jobs.JobOutcome) -> int | None:
        try:
            return jobs.finish(session, ticket.job_id, self.me.name, result).cycle_id
        except jobs.LeaseLost:
            log.warning("job %s: lease lost before finishing; outcome discarded", ticket.job_id)
            return None

    def _launch(self, ticket: Ticket) -> prepare.LaunchSettings:
        """The runner's settings for `ticket`, from the project config in its source."""
        key = (ticket.workdir, ticket.experiment)
        found = self._launches.get(key)
        if found is None:
            # From the copy its preparation kept, never from the export (the job's to write).
            path = paths.launch_config(self.settings, ticket.job_id)
            cfg = project_config.parse(path.read_text(encoding="utf-8"), str(path))
            found = prepare.launch_settings(cfg, ticket.experiment)
            # Two are kept: the next job's, read while this one ran (for its spare), is then
            # found here at its lease, off the GPU's idle gap.
            self._launches = {**dict(list(self._launches.items())[-1:]), key: found}
        return found

    def _launch_or(self, ticket: Ticket, default: prepare.LaunchSettings) -> prepare.LaunchSettings:
        try:
            return self._launch(ticket)
        except (InvalidInput, OSError):  # its run reports that; no spare is parked for it
            return default

    def _next_in_line(
        self, current: Ticket, launch: prepare.LaunchSettings
    ) -> tuple[Ticket, prepare.LaunchSettings]:
        try:
            with self.stores.ops_session() as session:
                job = jobs.first_waiting(session, self.me.queue, self.me.host)
                ready = preparation.preparation_on(session, job.id, self.me.host) if job else None
                ticket = Ticket.of(job, ready) if job is not None and ready is not None else None
            if ticket is not None:
                return ticket, self._launch(ticket)
        except Exception:  # a hint only
            log.debug("could not read the next job in line", exc_info=True)
        return current, launch

    def _ring(self, cycle_id: int | None) -> None:
        if cycle_id is None:
            return
        try:
            broker.ring_advance(self.settings, cycle_id)
        except Exception:  # the broker is away: the reaper re-rings stale cycles (cycles.stale)
            log.warning("cycle %s: advance doorbell not sent", cycle_id, exc_info=True)

    def cleanup(self) -> None:
        self._run_after_start()
        batch, self.pending_cleanup = self.pending_cleanup, []
        self._clean(batch)

    def _clean(self, batch: list[runtime.RuntimeDir]) -> None:
        """Finished jobs' runtime dirs, and (every few minutes) their exported trees."""
        release_all(batch)
        job_trees.sweep_in_background(self.stores, self.settings)

    def run_one(self, ticket: Ticket, settle: Settle | None = None) -> jobs.JobOutcome:
        """Run one leased (or reserved) job; returns its outcome for `_settle_and_lease` to
        store. `settle`, the previous job's outcome, is stored with this job's start."""
        log_path = paths.log_path(self.settings, ticket.job_id)
        if ticket.spec.get("kind") == "command":  # the repository's own program, run arm by arm
            if ticket.reserved:
                try:
                    self._started(ticket, settle, None, None)
                except jobs.LeaseLost as exc:
                    return jobs.JobOutcome(state="failed", error=str(exc), log_path=str(log_path))
            return self._command(ticket)
        try:
            launch_settings = self._launch(ticket)
        except (InvalidInput, OSError) as exc:  # its source or config is gone since it was prepared
            return jobs.JobOutcome(
                state="failed",
                error=redact_text(f"cannot read its launch settings in {ticket.workdir}: {exc}"),
                log_path=str(log_path),
            )
        sandboxed = self.settings.sandbox == "on"
        staged = self._staged_for(ticket)
        if staged is not None:  # made ready while the previous job ran, perhaps started
            spare, launch = None, staged.job
        else:
            spare, launch = self._launch_spec(ticket, launch_settings)
        rt = launch.runtime
        beat = Heartbeat(self, ticket.job_id)
        if staged is not None:
            beat.spawned_at = staged.started_wall  # handed over at the last job's exit
        outcome: runner.Outcome | None = None
        ran = False  # run_job took the launch (and the staged job with it)
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log_file:
                if not sandboxed:
                    log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
                    log_file.flush()
                on_event = self._event_handler(ticket, launch_settings, log_file, beat)
                try:
                    ran = True
                    outcome = runner.run_job(
                        launch,
                        limits=runner.Limits(timeout_s=ticket.time_limit_s),
                        on_event=on_event,
                        on_spawn=lambda pid, pgid: self._spawned(ticket, pid, pgid, beat, settle),
                        spare=spare,
                        deferred=self._defer,
                        staged=staged,
                        on_exit=self._go_next,
                    )
                    error = None
                except (LaunchError, jobs.LeaseLost) as exc:
                    outcome, error = None, str(exc)
                finally:
                    beat.stop(wait=False)
                    self._defer(beat.join)
                try:
                    beat.record_start()  # a reserved job that ended before its first line
                except jobs.LeaseLost as exc:
                    outcome, error = None, str(exc)
                if outcome is not None:
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
            result = job_outcome(self.settings, ticket, outcome, error, beat.cancelled, log_path)
            if result.state == "succeeded" and ticket.spec.get("head_vs_base"):
                beat = Heartbeat(self, ticket.job_id)  # the code changed: base against head too
                result = command_runs.head_vs_base(self.settings, self.me, ticket, result, beat)
        except OSError as exc:
            # The job's folder cannot be written (its filesystem is full or read-only): record
            # that as the outcome now. Raising would leave the lease to lapse and the job to be
            # retried blind until it failed as "lease expired", with the cause lost.
            result = jobs.JobOutcome(
                state="failed",
                error=f"cannot write the job's files in {log_path.parent}: {exc.strerror or exc}",
                log_path=str(log_path),
                gpu_seconds=outcome.duration_s if outcome is not None else 0.0,
            )
        finally:
            if spare is not None:
                spare.close()  # no-op once run_job has used it; kills it if we never got there
            if staged is not None and not ran:
                staged.abandon()  # run_job never got it (the job's folder failed first)
            self.pending_cleanup.append(rt)
        result.log_tail = logs.tail_text(log_path, paths.LOG_TAIL_BYTES)
        return result

    def _command(self, ticket: Ticket) -> jobs.JobOutcome:
        beat = Heartbeat(self, ticket.job_id)
        result = command_runs.run_command_job(
            self.stores, self.settings, self.me, ticket, beat, preparer=self.preparer,
            spares=self.spares,
        )  # fmt: skip
        result.log_tail = logs.tail_text(
            paths.log_path(self.settings, ticket.job_id), paths.LOG_TAIL_BYTES
        )
        return result

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

    def _event_handler(
        self, ticket: Ticket, launch: prepare.LaunchSettings, log_file: Any, beat: Heartbeat
    ) -> Callable[[dict[str, Any]], None]:
        def on_event(event: dict[str, Any]) -> None:
            kind = event.get("type")
            if kind == "started":
                if self.preparer is not None:
                    self.preparer.kick()  # the job's start is behind it: prepare what follows
                now = time.time()
                at = first_line_time(event.get("at"), lower=beat.spawned_at, upper=now)
                first_line = datetime.fromtimestamp(at, UTC)
                if not beat.record_start(first_line_at=first_line):
                    with self.stores.ops_session() as session:
                        jobs.mark_first_line(session, ticket.job_id, self.me.name, first_line)
                # The job's own start is behind it: reserve the next job now, and park its
                # interpreter (else for the job first in line, else for one like this one);
                # the exec stub the job may have used up is replaced for a later cold start.
                reserved = self._reserve()
                if self.spares is not None and self.settings.gpu_spare_interpreter:
                    after, hint = (
                        (reserved, self._launch_or(reserved, launch))
                        if reserved is not None
                        else self._next_in_line(ticket, launch)
                    )
                    sandboxed, known = self.settings.sandbox == "on", after.job_id != ticket.job_id
                    # A sandboxed spare binds its job's export: none is known, none is parked;
                    # a command job (no entry) runs no interpreter of ours.
                    if (not sandboxed or known) and hint.entry is not None:
                        self.spares.prestart(
                            state_dir=self.settings.state_dir.absolute(),
                            venv=after.venv,
                            suffix_len=hint.socket_suffix_len,
                            requirements_hash=hint.requirements_hash,
                            preload=hint.preload,
                            cuda_visible_devices=self.me.device or None,
                            sandboxed=sandboxed,
                            network=hint.network,
                            workdir=after.workdir,
                            cgroup_name=confine.job_cgroup_name(after.job_id) if known else None,
                        )
                        if reserved is not None:
                            self._stage_next(reserved, hint)
                self.ready_exec_stub()  # after the next job's own start is under way
            if kind in ("log", "progress"):
                log_file.write(logs.event_line(event) + "\n")
                log_file.flush()

        return on_event


@dataclass
class Settle:
    """A finished job whose outcome is stored with the next job's start (or on its own)."""

    ticket: Ticket
    outcome: jobs.JobOutcome
    stored: bool = False
