"""One job on a GPU host, read top to bottom: `JobRun`, from the moment the loop hands it a job
(leased, or reserved and taken: `reservation.py`) to its stored outcome.

launch     what the job starts with: its start staged while the previous job ran, else the
           interpreter parked for it, else a cold start (`Launch`).
supervise  the runner runs it (`launcher/runner.run_job`) on this thread, the loop's. The job's
           start is recorded here, by this run: a leased job's at its spawn; a reserved job's at
           its first line (or a heartbeat interval after its spawn, or its end, if sooner), in one
           transaction with the previous job's outcome, so that no DB work competes with the
           job's own start-up. Its heartbeat (`heartbeat.py`) renews its lease meanwhile.
measure    the outcome of the job, one strategy per kind of experiment: `Harness` (the entry
           module's in-process run), `HeadAgainstBase` (that, then the entry at base and at
           head, arm against arm) and `CommandArms` (the repository's own program, arm against
           arm: `command_runs.py`).
settle     its outcome stored, the one place a job becomes finished (`JobRun.settle`): by the
           loop with the next job's lease, or by the next job's run with that job's start
           (reserved), or alone.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeVar

from sqlalchemy.orm import Session

from app.errors import InvalidInput
from app.jobs import logs, paths, reservations
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.redaction import redact_text
from workers import command_runs, prepare
from workers.gpu.heartbeat import Heartbeat
from workers.gpu.outcomes import Settle
from workers.gpu.reservation import State
from workers.gpu.tickets import Ticket, first_line_time, job_outcome
from workers.launcher import confine, runner, runtime, staging
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.spare import Spare

if TYPE_CHECKING:
    from app.db import Stores
    from app.settings import Settings
    from workers.gpu.launch_settings import LaunchSettingsCache
    from workers.gpu.outcomes import OutcomeRecorder
    from workers.gpu.reservation import Reservation
    from workers.gpu.spares import SparePool
    from workers.gpu.tickets import WorkerIdentity
    from workers.launcher.spare import SpareSlot

log = logging.getLogger(__name__)


class Loop(Protocol):
    """What a run needs of the loop that hands it its job (`loop.RunLoop`): the worker's
    stores, settings and identity, its seams (the next job's reservation, the outcome recorder,
    the parked interpreters) and the clean-ups it keeps off the GPU's idle gap."""

    stores: Stores
    settings: Settings
    me: WorkerIdentity
    reservation: Reservation
    recorder: OutcomeRecorder
    pool: SparePool
    launches: LaunchSettingsCache
    preparer: prepare.Preparer | None
    spares: SpareSlot | None
    pending_cleanup: list[runtime.RuntimeDir]

    def defer(self, task: Callable[[], None]) -> None: ...

    def run_after_start(self) -> None: ...

    def ready_next(self, running: Ticket, launch: prepare.LaunchSettings) -> None: ...

    def ready_exec_stub(self) -> None: ...


T = TypeVar("T")


@dataclass
class Launch:
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
class _Start:
    """A reserved job's start, spawned but not yet recorded; due by `due` (monotonic)."""

    pid: int
    pgid: int
    due: float


@dataclass
class JobRun:
    """One job's run on this host: launch, supervise, measure (`run`), then settle."""

    loop: Loop
    ticket: Ticket
    #: The previous job's run, when this job was reserved: its outcome is stored with this
    #: job's start (one commit on the GPU's idle gap), or alone if this one never starts.
    previous: JobRun | None = None
    #: This job's outcome, once measured, until it is settled.
    done: Settle | None = None
    #: When the job's process started (wall clock): its first line cannot be earlier.
    spawned_at: float | None = None
    beat: Heartbeat | None = None
    _start: _Start | None = field(default=None, repr=False)

    @property
    def log_path(self) -> Path:
        return paths.log_path(self.loop.settings, self.ticket.job_id)

    def run(self) -> None:
        """Launch, supervise and measure the job, by its kind's strategy."""
        try:
            outcome = measurement_for(self.ticket).run(self)
        finally:
            if self.ticket.reserved:  # (a no-op once its start was recorded or refused)
                self.loop.reservation.closed(self.ticket, State.NOT_STARTED)
            previous = self.previous.done if self.previous is not None else None
            if previous is not None and not previous.stored:  # this job never started
                self.loop.recorder.record_alone(previous)
            self.previous = None  # settled: a long loop keeps no chain of runs
        self.done = Settle(self.ticket, outcome)

    # -- settle ------------------------------------------------------------------------------

    def settle(self, then: Callable[[Session], T]) -> T:
        """Store this job's outcome (through the job's lifecycle, `jobs.finish`) and run `then`,
        the next job's lease or start, in one transaction; `then`'s value. Should `then` fail,
        the outcome is stored alone before the error propagates (`OutcomeRecorder.record`)."""
        return self.loop.recorder.record(self.done, then)

    # -- launch --------------------------------------------------------------------------------

    def launch(self, launch_settings: prepare.LaunchSettings) -> Launch:
        staged = self.loop.reservation.staged_for(self.ticket)
        if staged is not None:  # made ready while the previous job ran, perhaps started
            return Launch(staged.job, staged=staged)
        spare, spec = self.loop.pool.launch_spec(self.ticket, launch_settings)
        return Launch(spec, spare=spare)

    def heartbeat(self) -> Heartbeat:
        """A heartbeat for one supervised stretch of the job (a thread runs once)."""
        loop = self.loop
        self.beat = Heartbeat(
            loop.stores,
            loop.settings,
            loop.me.name,
            self.ticket.job_id,
            gang=self.ticket.gpus > 1,
            renew_also=loop.reservation.renew,  # the next job's, if reserved
        )
        return self.beat

    # -- supervise -------------------------------------------------------------------------------

    def supervise(
        self,
        launch: Launch,
        launch_settings: prepare.LaunchSettings,
        log_file: IO[str],
        *,
        free_at_exit: bool,
    ) -> runner.Outcome | jobs.JobOutcome:
        """The runner's outcome, or the failure that kept the job from running (its start
        refused, its lease or reservation lost). `free_at_exit`: the device is free for the
        next job at this run's exit (else the measurement says when: `JobRun.device_free`)."""
        beat = self.heartbeat()
        if launch.staged is not None:
            self.spawned_at = launch.staged.started_wall  # handed over at the last job's exit
        outcome: runner.Outcome | jobs.JobOutcome
        try:
            launch.taken = True
            outcome = runner.run_job(
                launch.spec,
                limits=runner.Limits(
                    timeout_s=self.ticket.time_limit_s,
                    max_events_total_bytes=self.loop.settings.run_limits.event_bytes,
                ),
                on_event=self._event_handler(launch_settings, log_file),
                on_spawn=self._spawned,
                spare=launch.spare,
                deferred=self.loop.defer,
                staged=launch.staged,
                on_exit=self.device_free if free_at_exit else None,
                on_tick=self._start_when_due,
            )
        except LaunchError as exc:
            outcome = self.failure(End.FAILED_START, str(exc))
        except jobs.LeaseLost as exc:
            outcome = self.failure(End.LEASE_LOST, str(exc))
        finally:
            beat.stop(wait=False)
            self.loop.defer(beat.join)
        try:
            self._record_start()  # a reserved job that ended before its first line
        except jobs.LeaseLost as exc:
            outcome = self.failure(End.LEASE_LOST, str(exc))
        return outcome

    def device_free(self) -> None:
        """The job is done with the device: the staged next job starts now."""
        self.loop.reservation.go()

    def failure(self, ended: End, error: str) -> jobs.JobOutcome:
        return jobs.JobOutcome(ended=ended, error=error, log_path=str(self.log_path))

    def _spawned(self, pid: int, pgid: int) -> None:
        assert self.beat is not None
        self.beat.pgid = pgid
        self.spawned_at = self.spawned_at or time.time()
        if self.ticket.reserved:
            # Recorded with its first line, or a heartbeat's interval from now, or at its end.
            due = time.monotonic() + self.loop.settings.heartbeat_interval_s
            self._start = _Start(pid, pgid, due)
        else:
            self.beat.start()
            self.record_started(pid, pgid)

    def _start_when_due(self) -> float | None:
        """The runner's tick: a reserved job whose first line is slow to come has its start
        recorded a heartbeat's interval after its spawn (its reservation lapses otherwise). A
        failure other than a refused start is tried again an interval later."""
        start = self._start
        if start is None:
            return None
        if time.monotonic() < start.due:
            return start.due
        try:
            self._record_start()
        except jobs.LeaseLost:
            raise  # the runner kills what it started
        except Exception:
            log.warning("job %s: its start not recorded yet", self.ticket.job_id, exc_info=True)
            start.due = time.monotonic() + self.loop.settings.heartbeat_interval_s
            return start.due
        return None

    def _record_start(self, first_line_at: datetime | None = None) -> bool:
        """Record a reserved job's pending start now, once; False when none was pending. A
        failure other than a refused start leaves it pending."""
        start, self._start = self._start, None
        if start is None:
            return False
        try:
            self.record_started(start.pid, start.pgid, first_line_at)
        except jobs.LeaseLost:
            raise
        except Exception:
            self._start = start
            raise
        if self.beat is not None:
            self.beat.start()  # its lease is the job's now: renewed from here on
        return True

    def record_started(
        self, pid: int | None, pgid: int | None, first_line_at: datetime | None = None
    ) -> None:
        """Record the job's start: a reserved job's in one transaction with the previous job's
        outcome (and its first line, when known). A reservation lost or cancelled raises
        LeaseLost (the runner kills what it started); the previous outcome is stored alone."""
        mark = functools.partial(self._mark_started, pid, pgid, first_line_at)
        previous = self.previous.done if self.previous is not None else None
        try:
            self.loop.recorder.record(previous, mark)
        except jobs.LeaseLost:
            if self.ticket.reserved:
                self.loop.reservation.closed(self.ticket, State.LOST)
            raise
        if self.ticket.reserved:
            self.loop.reservation.closed(self.ticket, State.STARTED)
        self.loop.run_after_start()

    def _mark_started(
        self, pid: int | None, pgid: int | None, first_line_at: datetime | None, session: Session
    ) -> None:
        job_id, worker = self.ticket.job_id, self.loop.me.name
        if self.ticket.reserved:
            reservations.start_reserved(session, job_id, worker, pid, pgid)
        elif pid is not None and pgid is not None:
            jobs.mark_running(session, job_id, worker, pid, pgid)
        if first_line_at is not None:
            jobs.mark_first_line(session, job_id, worker, first_line_at)

    # -- at the job's first line ------------------------------------------------------------------

    def _event_handler(
        self, launch_settings: prepare.LaunchSettings, log_file: IO[str]
    ) -> Callable[[dict[str, Any]], None]:
        def on_event(event: dict[str, Any]) -> None:
            kind = event.get("type")
            if kind == "started":
                self._first_line(launch_settings, event.get("at"))
            if kind in ("log", "progress"):
                log_file.write(logs.event_line(event) + "\n")
                log_file.flush()

        return on_event

    def _first_line(self, launch_settings: prepare.LaunchSettings, reported: Any) -> None:
        """The end of the GPU's idle gap (a reserved job's start is recorded with it); the job's
        start is behind it: prepare, reserve and park for what follows."""
        if self.loop.preparer is not None:
            self.loop.preparer.kick()
        at = first_line_time(reported, lower=self.spawned_at, upper=time.time())
        first_line = datetime.fromtimestamp(at, UTC)
        if not self._record_start(first_line_at=first_line):
            with self.loop.stores.ops_session() as session:
                jobs.mark_first_line(session, self.ticket.job_id, self.loop.me.name, first_line)
        self.loop.ready_next(self.ticket, launch_settings)
        self.loop.ready_exec_stub()  # after the next job's own start is under way


# -- measure: one strategy per kind --------------------------------------------------------------


class Measurement(Protocol):
    def run(self, job: JobRun) -> jobs.JobOutcome:
        """Launch, supervise and measure the job; its outcome, never an exception for what
        went wrong with the job (raising would leave its lease to lapse and the job to be
        retried blind)."""
        ...


def measurement_for(ticket: Ticket) -> Measurement:
    if ticket.spec.get("kind") == "command":
        return CommandArms()
    if ticket.spec.get("head_vs_base"):
        return HeadAgainstBase()
    return Harness()


class Harness:
    """A harness job: its entry module run in-process once; the outcome from what the runner
    saw (its exit, its result file). The device is free at the job's exit."""

    free_at_exit = True

    def run(self, job: JobRun) -> jobs.JobOutcome:
        try:
            launch_settings = job.loop.launches.of(job.ticket)
        except (InvalidInput, OSError) as exc:  # its source or config is gone since it was prepared
            error = f"cannot read its launch settings in {job.ticket.workdir}: {exc}"
            return job.failure(End.FAILED_START, redact_text(error))
        launch = job.launch(launch_settings)
        try:
            outcome = self.measure(job, launch, launch_settings)
        finally:
            launch.close(job.loop.pending_cleanup)
        outcome.log_tail = logs.tail_text(job.log_path, paths.LOG_TAIL_BYTES)
        return outcome

    def measure(
        self, job: JobRun, launch: Launch, launch_settings: prepare.LaunchSettings
    ) -> jobs.JobOutcome:
        """Run the job with its log open; its outcome, from what the runner saw."""
        log_path, ran = job.log_path, None
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log_file:
                if job.loop.settings.sandbox != "on":
                    log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
                    log_file.flush()
                ran = job.supervise(
                    launch, launch_settings, log_file, free_at_exit=self.free_at_exit
                )
                if isinstance(ran, runner.Outcome):
                    note_launch(job.ticket, ran, log_file)
            if not isinstance(ran, runner.Outcome):
                return ran
            assert job.beat is not None
            return outcome_of(job, ran, job.beat.cancelled)
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


class HeadAgainstBase(Harness):
    """A harness job whose cycle changed code: its in-process run, then its entry module at
    base and at head, arm against arm in the same lease (`command_runs.head_vs_base`). The
    device is the job's until those runs end: the next job starts then, not at its exit."""

    free_at_exit = False

    def measure(
        self, job: JobRun, launch: Launch, launch_settings: prepare.LaunchSettings
    ) -> jobs.JobOutcome:
        try:
            outcome = super().measure(job, launch, launch_settings)
            if outcome.ended is End.COMPLETED:
                loop = job.loop
                outcome = command_runs.head_vs_base(
                    loop.settings, loop.me, job.ticket, outcome, job.heartbeat()
                )
            return outcome
        finally:
            job.device_free()


class CommandArms:
    """A command job: the repository's own program, run arm against arm from outside, each run
    a fresh process (`command_runs.run_command_job`), which marks the job running at its first
    run. A reserved one's start is recorded before its runs."""

    def run(self, job: JobRun) -> jobs.JobOutcome:
        if job.ticket.reserved:
            try:
                job.record_started(None, None)
            except jobs.LeaseLost as exc:
                return job.failure(End.LEASE_LOST, str(exc))
        loop = job.loop
        outcome = command_runs.run_command_job(
            loop.stores,
            loop.settings,
            loop.me,
            job.ticket,
            job.heartbeat(),
            preparer=loop.preparer,
            spares=loop.spares,
        )
        outcome.log_tail = logs.tail_text(job.log_path, paths.LOG_TAIL_BYTES)
        return outcome


def outcome_of(job: JobRun, ran: runner.Outcome, cancelled: bool) -> jobs.JobOutcome:
    """The job's outcome from the runner's; a limit of its cgroup that stopped it first."""
    result = job_outcome(job.loop.settings, job.ticket, ran, None, cancelled, job.log_path)
    if ran.limit is not None and result.ended in (End.COMPLETED, End.FAILED):
        # its cgroup's limit stopped it (a refused fork, an OOM kill): say so first
        result.ended = End.FAILED
        if ran.limit not in (result.error or ""):
            result.error = ran.limit + (f"; {result.error}" if result.error else "")
    return result


def note_launch(ticket: Ticket, outcome: runner.Outcome, log_file: IO[str]) -> None:
    """How the job started, then its output, in its log."""
    if ticket.reserved:
        log_file.write("[launch] reserved while the previous job ran\n")
    if outcome.launch == "spare":
        log_file.write("[launch] handed to the parked interpreter\n")
    elif outcome.spare_missed:
        log_file.write(f"[launch] started cold: {outcome.spare_missed}\n")
    if outcome.launch == "stub":
        log_file.write(
            f"[launch] started cold by the worker's exec stub, in cgroup {outcome.cgroup or '?'}\n"
        )
    log_file.write(outcome.stdout)
    log_file.write(outcome.stderr)
    log_file.write("".join(f"{line}\n" for line in outcome.notes()))
