"""The GPU loop: lease the oldest prepared job of the worker's queue, run it through the
launcher, record exactly one outcome, and go straight on to the next prepared job without
waiting for another doorbell; cleanup is batched after release.

Preparation happens before (`prepare.py`, DESIGN.md lesson 3); the parked interpreter for the
next job is `launcher/spare.py`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session

from app import broker
from app.db import Stores
from app.errors import InvalidInput
from app.jobs import logs, paths, preparation
from app.jobs import service as jobs
from app.projects import config as project_config
from app.settings import Settings, redact_text
from workers import command_runs, control_client, prepare
from workers.heartbeat import Heartbeat
from workers.launcher import confine, runner, runtime
from workers.launcher.launch import LaunchError, LaunchSpec
from workers.launcher.spare import SpareSlot

if TYPE_CHECKING:
    from app.jobs.models import Job, JobPreparation

log = logging.getLogger(__name__)
CLEANUP_BATCH = 8


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:500] if lines else ""


@dataclass
class WorkerIdentity:
    name: str
    kind: str
    device: str  # what CUDA_VISIBLE_DEVICES gets; "" on a CPU worker
    host: str = field(default_factory=socket.gethostname)

    @property
    def queue(self) -> str:
        return f"gpu.{self.kind}"

    @classmethod
    def for_device(cls, kind: str, device: str) -> WorkerIdentity:
        host = socket.gethostname()
        return cls(name=f"gpu-{kind}-{device or 'x'}@{host}", kind=kind, device=device, host=host)


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
    #: Prepares this host's next jobs while the GPU runs one; None prepares only when idle.
    preparer: prepare.Preparer | None = None
    #: Launch settings read for the job in line and the job running (by source, experiment).
    _launches: dict[tuple[str, str], prepare.LaunchSettings] = field(default_factory=dict)

    def run_available(self) -> int:
        """Run prepared jobs until none is left; returns how many ran.

        Each job's outcome is stored in the same transaction that leases the next job: one
        commit between two jobs instead of two, which is GPU idle time (bench/handoff.py).
        """
        ran = 0
        done: tuple[Ticket, jobs.JobOutcome] | None = None
        try:
            while True:
                # (on an error it has stored the outcome itself before raising)
                finished, done = done, None
                ticket = self._settle_and_lease(finished)
                if ticket is None:
                    # Nothing is ready on this host: the GPU is idle anyway, so prepare the
                    # first job in line here now (another host may have prepared it already).
                    if prepare.prepare_ahead(self.stores, self.settings, self.me.queue, want=1):
                        continue
                    break
                if len(self.pending_cleanup) >= CLEANUP_BATCH:
                    # Off the GPU's path and after the outcomes are stored: a slow removal
                    # never holds a finished job's lease past its TTL.
                    batch, self.pending_cleanup = self.pending_cleanup, []
                    threading.Thread(
                        target=release_all, args=(batch,), name="runtime-cleanup", daemon=True
                    ).start()
                done = (ticket, self.run_one(ticket))
                ran += 1
        finally:
            self.cleanup()
        return ran

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
        batch, self.pending_cleanup = self.pending_cleanup, []
        release_all(batch)

    def run_one(self, ticket: Ticket) -> jobs.JobOutcome:
        """Run one leased job; returns its outcome for `_settle_and_lease` to store."""
        log_path = paths.log_path(self.settings, ticket.job_id)
        if ticket.spec.get("kind") == "command":  # the repository's own program, run arm by arm
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
        spare = (
            self.spares.take(
                venv=ticket.venv,
                suffix_len=launch_settings.socket_suffix_len,
                preload=launch_settings.preload,
                workdir=ticket.workdir,
                network=launch_settings.network,
            )
            if self.spares is not None
            else None
        )
        if spare is not None:
            rt = spare.runtime
        else:
            rt = runtime.allocate_runtime(
                state_dir=self.settings.state_dir.absolute(),
                env=os.environ,
                suffix_len=launch_settings.socket_suffix_len,
            )
        launch = LaunchSpec(
            venv=Path(ticket.venv),
            entry=str(launch_settings.entry),
            cwd=Path(ticket.workdir),
            runtime=rt,
            spec=ticket.spec,
            cuda_visible_devices=self.me.device or None,
            pythonpath=[Path(ticket.workdir)],
            base_env=dict(os.environ),
            requirements_hash=launch_settings.requirements_hash,
            sandboxed=sandboxed,
            network=launch_settings.network,
            cgroup=confine.job_cgroup_name(ticket.job_id),
        )
        beat = Heartbeat(self, ticket.job_id)
        outcome: runner.Outcome | None = None
        try:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as log_file:
                if not sandboxed:
                    log_file.write(confine.UNCONFINED_LOG_LINE + "\n")
                    log_file.flush()
                on_event = self._event_handler(ticket, launch_settings, log_file, beat)
                try:
                    beat.start()
                    outcome = runner.run_job(
                        launch,
                        limits=runner.Limits(timeout_s=ticket.time_limit_s),
                        on_event=on_event,
                        on_spawn=lambda pid, pgid: self._spawned(ticket.job_id, pid, pgid, beat),
                        spare=spare,
                    )
                    error = None
                except (LaunchError, jobs.LeaseLost) as exc:
                    outcome, error = None, str(exc)
                finally:
                    beat.stop()
                if outcome is not None:
                    if outcome.launch == "spare":
                        log_file.write("[launch] handed to the parked interpreter\n")
                    elif outcome.spare_missed:
                        log_file.write(f"[launch] started cold: {outcome.spare_missed}\n")
                    log_file.write(outcome.stdout)
                    log_file.write(outcome.stderr)
            result = self._outcome(ticket, outcome, error, beat.cancelled, log_path)
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

    def _spawned(self, job_id: int, pid: int, pgid: int, beat: Heartbeat) -> None:
        beat.pgid = pgid
        beat.spawned_at = time.time()
        with self.stores.ops_session() as session:
            jobs.mark_running(session, job_id, self.me.name, pid, pgid)

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
                with self.stores.ops_session() as session:
                    jobs.mark_first_line(
                        session, ticket.job_id, self.me.name, datetime.fromtimestamp(at, UTC)
                    )
                if self.spares is not None and self.settings.gpu_spare_interpreter:
                    # The job's own start is behind it: park the next job's interpreter now,
                    # for the job first in line (its venv), else for one like this one.
                    after, hint = self._next_in_line(ticket, launch)
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
            if kind in ("log", "progress"):
                log_file.write(logs.event_line(event) + "\n")
                log_file.flush()

        return on_event

    def _outcome(
        self,
        ticket: Ticket,
        outcome: runner.Outcome | None,
        error: str | None,
        cancelled: bool,
        log_path: Path,
    ) -> jobs.JobOutcome:
        if outcome is None:
            return jobs.JobOutcome(state="failed", error=error, log_path=str(log_path))
        result = outcome.result if isinstance(outcome.result, dict) else None
        if result is not None:
            # The worker's record, not the child's: whatever the job wrote under this key.
            result = {**result, "sandbox": self.settings.sandbox}
        state, message = "succeeded", None
        if cancelled:
            state, message = "cancelled", "cancelled while running; its process group was killed"
        elif outcome.timed_out:
            state, message = "failed", f"time limit of {ticket.time_limit_s:g} s exceeded"
        elif outcome.returncode != 0:
            state = "failed"
            message = f"exited with {outcome.signal or outcome.returncode}: " + (
                _last_line(outcome.stderr) or _last_line(outcome.stdout) or "no output"
            )
        elif outcome.result_error:
            state, message = "failed", outcome.result_error
        elif result is not None and result.get("status") == "error":
            state, message = "failed", f"experiment error: {result.get('error')}"
        result_path = None
        if result is not None:
            saved = paths.job_dir(self.settings, ticket.job_id) / "result.json"
            saved.write_text(json.dumps(result, indent=2))
            result_path = str(saved)
        return jobs.JobOutcome(
            state=state,
            exit_code=outcome.returncode,
            error=message,
            result=result,
            result_path=result_path,
            log_path=str(log_path),
            gpu_seconds=outcome.duration_s,
        )


def first_line_time(reported: Any, *, lower: float | None, upper: float) -> float:
    """When the job's first line of user code ran, as a wall-clock timestamp.

    The `started` event may carry `at` (the job's `time.time()`, same host): used when it lies
    between the spawn and now, so the parent's own delay in reading the event is not counted
    as idle GPU time. Otherwise, the moment the event was read.
    """
    if (
        isinstance(reported, int | float)
        and not isinstance(reported, bool)
        and lower is not None
        and lower <= reported <= upper
    ):
        return float(reported)
    return upper


@dataclass
class Ticket:
    """What the GPU path needs of a job, read once at lease time."""

    job_id: int
    experiment: str
    workdir: str
    venv: str
    spec: dict[str, Any]  # what the experiment sees
    time_limit_s: float

    @classmethod
    def of(cls, job: Job, prepared: JobPreparation | None = None) -> Ticket:
        """The leased job (its row holds where it runs), or one waiting with this host's
        preparation of it."""
        where = prepared or job
        return cls(
            job_id=job.id,
            experiment=str(job.experiment),
            workdir=str(where.workdir),
            venv=str(where.venv_path),
            spec=dict(job.spec),
            time_limit_s=job.time_limit_s,
        )
