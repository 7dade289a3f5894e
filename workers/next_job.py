"""What a GPU worker does about its next job while the current one runs: reserve it
(`app/jobs/reservations.py`), keep the reservation, and stage it (`launcher/staging.py`) on the
interpreter parked for it, so that the current job's exit starts it with one pipe write."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import reservations
from app.jobs.models import Job, Lease
from app.settings import Settings
from workers import gang_members, prepare
from workers.claims import Claims
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
        #: Whether this worker or an idle one starts a reserved job (`claims.py`).
        self.claims = Claims(settings.state_dir)
        self._claimed: int | None = None  # this worker starts it
        self._refused: int | None = None  # an idle worker took it over, or it may have lapsed
        #: When the reservation was last made or renewed (monotonic): one not renewed for
        #: about a lease's time may have lapsed and gone to another worker, and is not started.
        self._renewed = 0.0

    def take(self) -> Ticket | None:
        """The reserved job, to run now; None when none was reserved, or its reservation was
        lost before it started."""
        ticket, self.reserved = self.reserved, None
        lost, self._lost = self._lost, None
        started = self._staged is not None and self._staged[1].proc is not None
        if ticket is None or started:
            # (lost but already started: recording its start fails, and that kills it)
            return ticket
        if (
            lost == ticket.job_id
            or not self.gate.admits(ticket.time_limit_s)
            or not self._claim(ticket)
        ):
            self._abandon(self._staged)
            self._staged = None
            if lost != ticket.job_id:  # drains, too late for it, or taken over meanwhile
                self._give_back(ticket)
            self._forget(ticket)
            return None
        return ticket

    def may_take(self, job: Job, reservation: Lease) -> bool:
        """For `jobs.lease_next`, as an idle worker: may this worker take over `job`, which
        `reservation`'s worker of this host reserved? Only while that one has not started it."""
        return self.claims.take(job.id, job.attempts or 0, reservation.worker)

    def started(self, ticket: Ticket) -> None:
        """The reserved job's start is in the ops DB: no idle worker can take it any more."""
        if self._claimed == ticket.job_id:
            self._forget(ticket)

    def _forget(self, ticket: Ticket) -> None:
        """The reservation is over (started, given back or lost): its claim decides nothing."""
        if ticket.job_id in (self._claimed, self._refused):
            self.claims.forget(ticket.job_id, ticket.attempt, self.me.name)
        self._claimed = self._refused = None

    def _claim(self, ticket: Ticket) -> bool:
        """The reserved job is about to start here: False (not started) when an idle worker
        of this host has taken it over (`claims.py`; a file and a lock, off the database), or
        when its reservation, not renewed for about a lease's time, may have lapsed."""
        if self._claimed == ticket.job_id:
            return True
        if self._refused == ticket.job_id:
            return False
        since = time.monotonic() - self._renewed
        if since > self.settings.lease_ttl_s - self.settings.heartbeat_interval_s:
            log.info("job %s: reservation unrenewed for %.0f s: not started", ticket.job_id, since)
            self._refused = ticket.job_id
            return False
        if not self.claims.start(ticket.job_id, ticket.attempt, self.me.name):
            log.info("job %s: taken over by an idle worker; not started here", ticket.job_id)
            self._refused = ticket.job_id
            return False
        self._claimed = ticket.job_id
        return True

    def release(self) -> None:
        """Give the reservation back (the loop ends)."""
        staged, self._staged = self._staged, None
        self._abandon(staged)
        ticket, self.reserved = self.reserved, None
        if ticket is not None:
            self._give_back(ticket)
            self._forget(ticket)

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
        if ticket is None:
            return
        if reservations.renew(session, self.settings, ticket.job_id, self.me.name):
            self._renewed = time.monotonic()
        else:
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
                self._claimed = self._refused = None  # (any earlier one is over)
                self._renewed = time.monotonic()
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
            and self._claim(reserved)  # else an idle worker took it over: `take` gives it back
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
