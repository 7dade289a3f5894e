"""What a GPU worker does about its next job while the current one runs: reserve it
(`app/jobs/reservations.py`), keep the reservation, and stage it (`launcher/staging.py`) on the
interpreter parked for it, so that the current job's exit starts it with one pipe write."""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import reservations
from app.settings import Settings
from workers import gang_members, prepare
from workers.launcher import runtime, staging
from workers.launcher.launch import LaunchError
from workers.lease_gate import GATE, LeaseGate, PastDeadline
from workers.spares import SparePool
from workers.tickets import Ticket, WorkerIdentity

log = logging.getLogger(__name__)


class NextJob:
    """The job reserved to run after the current one, and its staged start."""

    def __init__(
        self,
        stores: Stores,
        settings: Settings,
        me: WorkerIdentity,
        spares: SparePool,
        discard: Callable[[runtime.RuntimeDir], None],
        gate: LeaseGate = GATE,
    ) -> None:
        """`discard` takes a runtime dir no job will use, for the loop's batched cleanup;
        `gate` says whether the reserved job may still start when its turn comes."""
        self.stores, self.settings, self.me = stores, settings, me
        self.spares, self.discard, self.gate = spares, discard, gate
        self.reserved: Ticket | None = None
        #: Set by the heartbeat thread when the reservation was lost or cancelled.
        self._lost: int | None = None
        #: The reserved job, made ready to start (job id, what `runner.run_job` takes).
        self._staged: tuple[int, staging.Staged] | None = None
        #: The reserved job made this worker's to run (`reservations.confirm`).
        self._confirmed: int | None = None

    def take(self) -> Ticket | None:
        """The reserved job, to run now; None when none was reserved, or its reservation was
        lost before it started."""
        ticket, self.reserved = self.reserved, None
        lost, self._lost = self._lost, None
        confirmed, self._confirmed = self._confirmed, None
        started = self._staged is not None and self._staged[1].proc is not None
        if ticket is None or started or confirmed == ticket.job_id:
            return ticket
        if (
            lost == ticket.job_id
            or not self.gate.admits(ticket.time_limit_s)
            or not self._confirm(ticket.job_id)
        ):
            self._abandon(self._staged)
            self._staged = None
            if lost != ticket.job_id and self._lost != ticket.job_id:
                self._give_back(ticket)  # the worker drains, or it is too late for this job
            self._lost = self._confirmed = None
            return None
        self._confirmed = None
        return ticket

    def _confirm(self, job_id: int) -> bool:
        """Make the reserved job this worker's to run, before anything of it starts; False
        (and it is lost) when an idle worker took it over or it was cancelled."""
        try:
            with self.stores.ops_session() as session:
                mine = reservations.confirm(session, job_id, self.me.name)
        except Exception:  # the reaper returns it to the queue when its lease lapses
            log.warning("job %s: could not confirm the reservation", job_id, exc_info=True)
            mine = False
        if mine:
            self._confirmed = job_id
        else:
            log.info("job %s: no longer reserved by %s", job_id, self.me.name)
            self._lost = job_id
        return mine

    def release(self) -> None:
        """Give the reservation back (the loop ends)."""
        staged, self._staged = self._staged, None
        self._abandon(staged)
        ticket, self.reserved = self.reserved, None
        if ticket is not None:
            self._give_back(ticket)

    def _give_back(self, ticket: Ticket) -> None:
        """The reserved job waits in its place in the queue again."""
        try:
            with self.stores.ops_session() as session:
                reservations.release(session, ticket.job_id, self.me.name)
        except Exception:  # the reaper returns it to the queue when its lease lapses
            log.warning("job %s: reservation not released", ticket.job_id, exc_info=True)

    def renew(self, session: Session) -> None:
        """Called by the running job's heartbeat (same transaction): keep the reservation."""
        ticket = self.reserved
        if ticket is not None and not reservations.renew(
            session, self.settings, ticket.job_id, self.me.name
        ):
            self._lost = ticket.job_id

    def reserve(self) -> Ticket | None:
        """Reserve the job to run after the current one; None when none fits (a hint: any
        failure leaves the next job to be leased when this one ends)."""
        if not self.settings.gpu_reserve_next or self.reserved is not None or self.gate.draining:
            return self.reserved
        try:
            with self.stores.ops_session() as session:
                job = reservations.reserve_next(
                    session,
                    self.settings,
                    queue=self.me.queue,
                    worker=self.me.name,
                    device=self.me.device,
                    host=self.me.host,
                    alive=gang_members.alive,
                )
                if job is not None:  # too late already: rolled back, the job stays queued
                    self.gate.check(job.id, job.time_limit_s)
                self.reserved = Ticket.of(job, reserved=True) if job is not None else None
        except PastDeadline as exc:
            log.info("%s", exc)
        except Exception:
            log.warning("could not reserve the next job", exc_info=True)
        return self.reserved

    def stage(self, reserved: Ticket, launch_settings: prepare.LaunchSettings) -> None:
        """Make the reserved job ready to start (its parked interpreter just started for it),
        so that the current job's exit starts it with one pipe write (`go`)."""
        if self._staged is not None or reserved.spec.get("kind") == "command":
            return
        spare, launch = self.spares.launch_spec(reserved, launch_settings)
        if spare is None:  # a cold start is what the runner does best at the time
            self.discard(launch.runtime)
            return
        try:
            self._staged = (reserved.job_id, staging.stage(launch, spare))
        except (LaunchError, OSError):
            log.warning("job %s: could not stage it ahead", reserved.job_id, exc_info=True)
            self.discard(launch.runtime)

    def go(self) -> None:
        """The running job is done with the device: start the staged next job now (before
        anything else). That is its exit, or for a job that runs head against base after it,
        the end of those runs (`RunLoop._supervise`): the next job never shares the device
        with a measurement."""
        reserved = self.reserved
        if (
            self._staged is not None
            and self._lost != self._staged[0]
            and reserved is not None
            and self.gate.admits(reserved.time_limit_s)  # else `take` gives it back
            and self._confirm(self._staged[0])  # else it is someone else's, or cancelled
        ):
            try:
                self._staged[1].go()
            except LaunchError:  # its run (`run_job`) tries again, cold
                log.warning("job %s: the staged start failed", self._staged[0], exc_info=True)

    def staged_for(self, ticket: Ticket) -> staging.Staged | None:
        """The staged start of `ticket`, taken (any other staged job is abandoned)."""
        found, self._staged = self._staged, None
        if found is not None and found[0] == ticket.job_id:
            return found[1]
        self._abandon(found)
        return None

    def _abandon(self, found: tuple[int, staging.Staged] | None) -> None:
        if found is not None:
            found[1].abandon()
            self.discard(found[1].job.runtime)
