"""A GPU worker's reservation of its next job, made while its current job runs: one object with
one state, which says what the worker does about that job and who starts it.

    none, or an end   → reserved      `reserve`, at the running job's first line
    reserved          → staged        `stage`, on the interpreter parked for it
    reserved, staged  → handed        its turn (`go` at the running job's exit, or `take`)
                      → given_back    the same turn: draining, past the deadline, or unrenewed
                      → taken_over    the same turn: an idle worker of the host claimed it first
                      → lost          the same turn: its renewal had failed
    handed            → started       its run recorded its start (`closed`)
                      → lost          its start was refused (cancelled, or it lapsed)
                      → not_started   its run ended before its start (a failed start)

*reserved*: the job's lease row is this worker's and the job is `reserved` in the ops DB
(`app/jobs/reservations.py`), in its place in line; the running job's heartbeat renews the
reservation (`renew`, the one call made from another thread: it only notes a renewal or its
failure). *staged*: its start is made ready on the interpreter parked for it
(`launcher/staging.py`), so that the current job's exit starts it with one pipe write (`go`).
*handed*: this worker starts it: the host's claim file says so (`claims.py`, which decides a
takeover by an idle worker of the host), and the job is handed to its run (`run.py`), which
records its start in the ops DB: *started*, or *lost* (the start was refused: cancelled, or the
reservation lapsed), or *not_started* (its run ended before its start: a failed start, whose
outcome settles it). A reservation that does not reach its run ends *given_back* (the worker
drains, the job no longer fits its deadline, or it was not renewed for about a lease's time: it
may have lapsed), *taken_over* (an idle worker of the host claimed it first) or *lost* (its
renewal failed).

The moves are a table of the one state-machine primitive (`RESERVATION`, app/statemachine.py),
as every lifecycle's are, though this one lives in a worker's memory, not in a row. A move the
table does not hold raises `IllegalMove`, as in every lifecycle: here only a bug of the loop's
can make one, nothing on the host catches it apart from any other error, and its HTTP status
(409) never reaches a client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from enum import StrEnum

from sqlalchemy.orm import Session

from app.db import Stores
from app.jobs import reservations
from app.jobs.models import Job, Lease
from app.settings import Settings
from app.statemachine import Lifecycle, Move
from workers import gang_members, prepare
from workers.gpu.claims import Claims
from workers.gpu.spares import SparePool
from workers.gpu.tickets import Ticket, WorkerIdentity
from workers.launcher import runtime, staging
from workers.launcher.launch import LaunchError
from workers.lease_gate import GATE, LeaseGate, PastDeadline

log = logging.getLogger(__name__)


class State(StrEnum):
    NONE = "none"
    RESERVED = "reserved"
    STAGED = "staged"
    HANDED = "handed"
    STARTED = "started"
    NOT_STARTED = "not_started"
    GIVEN_BACK = "given_back"
    TAKEN_OVER = "taken_over"
    LOST = "lost"


#: Where a reservation is still waiting for its turn (the heartbeat renews it).
WAITING = frozenset({State.RESERVED, State.STAGED})
#: Its ends: a new reservation may be made from any of them.
ENDS = frozenset(
    {
        State.NONE,
        State.STARTED,
        State.NOT_STARTED,
        State.GIVEN_BACK,
        State.TAKEN_OVER,
        State.LOST,
    }
)

_WAITING = (State.RESERVED, State.STAGED)
_ENDS = tuple(s for s in State if s in ENDS)

RESERVATION = Lifecycle(
    "job reservation",
    State,
    (
        Move(
            _ENDS,
            (State.RESERVED,),
            "Reservation.reserve",
            "the running job's first line: the job to run after it is leased to this worker",
        ),
        Move(
            (State.RESERVED,),
            (State.STAGED,),
            "Reservation.stage",
            "its start is made ready on the interpreter parked for it",
        ),
        Move(
            _WAITING,
            (State.HANDED,),
            "Reservation.go, Reservation.take",
            "its turn came and the host's claim is this worker's: its run starts it",
        ),
        Move(
            _WAITING,
            (State.GIVEN_BACK,),
            "Reservation.go, Reservation.take, Reservation.release",
            "at its turn the worker drains, it is past the deadline, or it went unrenewed for "
            "about a lease; or the loop ends",
        ),
        Move(
            _WAITING,
            (State.TAKEN_OVER,),
            "Reservation.go, Reservation.take",
            "an idle worker of the host claimed it first",
        ),
        Move(_WAITING, (State.LOST,), "Reservation.go, Reservation.take", "its renewal failed"),
        Move((State.HANDED,), (State.STARTED,), "Reservation.closed", "its run recorded its start"),
        Move(
            (State.HANDED,),
            (State.LOST,),
            "Reservation.closed",
            "its start was refused: cancelled, or the reservation lapsed",
        ),
        Move(
            (State.HANDED,),
            (State.NOT_STARTED,),
            "Reservation.closed",
            "its run ended before its start (a failed start, whose outcome settles it)",
        ),
    ),
    attr="_state",
)


class Reservation:
    """This worker's reservation of the job to run after the current one."""

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
        self._state: str = State.NONE  # moved only by `RESERVATION.move`
        self.ticket: Ticket | None = None
        #: The start made ready (`stage`), until its run takes it (`staged_for`).
        self._staged: staging.Staged | None = None
        #: Whether an idle worker of this host took it over (a file and a lock, off the DB).
        self.claims = Claims(settings.state_dir)
        #: Noted by the heartbeat's thread: the job whose renewal failed, and when the
        #: reservation was last made or renewed (monotonic).
        self._lost: int | None = None
        self._renewed = 0.0

    @property
    def state(self) -> State:
        return State(self._state)

    @property
    def id(self) -> int | None:
        """The reserved job's id: what `RESERVATION` names it by (None before the first)."""
        return self.ticket.job_id if self.ticket is not None else None

    # -- made and kept while the current job runs ------------------------------------------

    def reserve(self) -> Ticket | None:
        """Reserve the job to run after the current one; None when none fits (a hint: any
        failure leaves the next job to be leased when this one ends)."""
        if self.state in WAITING:
            return self.ticket
        if self.state not in ENDS or not self.settings.gpu_reserve_next or self.gate.draining:
            return None
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
                if job is None:
                    return None
                self.gate.check(job.id, job.time_limit_s)  # too late: rolled back, stays queued
                ticket = Ticket.of(job, reserved=True)
        except PastDeadline as exc:
            log.info("%s", exc)
            return None
        except Exception:
            log.warning("could not reserve the next job", exc_info=True)
            return None
        self.ticket, self._lost, self._renewed = ticket, None, time.monotonic()
        RESERVATION.move(self, State.RESERVED)
        return ticket

    def renew(self, session: Session) -> None:
        """Called by the running job's heartbeat (its transaction, its thread): keep the
        reservation. What it learns waits for the loop's thread (`take`, `go`)."""
        ticket = self.ticket
        if self.state not in WAITING or ticket is None:
            return
        if reservations.renew(session, self.settings, ticket.job_id, self.me.name):
            self._renewed = time.monotonic()
        else:
            self._lost = ticket.job_id

    def stage(self, reserved: Ticket, launch_settings: prepare.LaunchSettings) -> None:
        """Make the reserved job ready to start (its parked interpreter just started for it),
        so that the current job's exit starts it with one pipe write (`go`)."""
        if self.state is not State.RESERVED or reserved.spec.get("kind") == "command":
            return
        spare, launch = self.spares.launch_spec(reserved, launch_settings)
        if spare is None:  # a cold start is what the runner does best at the time
            self.discard(launch.runtime)
            return
        try:
            self._staged = staging.stage(launch, spare)
        except (LaunchError, OSError):
            log.warning("job %s: could not stage it ahead", reserved.job_id, exc_info=True)
            self.discard(launch.runtime)
            return
        RESERVATION.move(self, State.STAGED)

    # -- its turn: handed to its run, or ended ---------------------------------------------

    def go(self) -> None:
        """The running job is done with the device: start the staged next job now (before
        anything else). That is its exit, or for a job that measures head against base after
        it, the end of those runs (`run.HeadAgainstBase`): the next job never shares the device
        with a measurement."""
        if self.state is not State.STAGED or self._turn() is None:
            return
        assert self._staged is not None
        try:
            self._staged.go()
        except LaunchError:  # its run (`run_job`) tries again, cold
            log.warning("job %s: the staged start failed", self.id, exc_info=True)

    def take(self) -> Ticket | None:
        """The reserved job, for its run to start now (its staged start: `staged_for`); None
        when none was reserved, or the reservation ended at its turn."""
        return self._turn()

    def _turn(self) -> Ticket | None:
        """Hand the reservation over (its claim written) or end it."""
        if self.state is State.HANDED:
            return self.ticket
        if self.state not in WAITING or self.ticket is None:
            return None
        ticket = self.ticket
        if self._lost == ticket.job_id:
            self._end(State.LOST)
        elif not self.gate.admits(ticket.time_limit_s):
            self._end(State.GIVEN_BACK)  # the worker drains, or it is too late for it
        elif self._unrenewed(ticket):
            self._end(State.GIVEN_BACK)
        elif not self.claims.start(ticket.job_id, ticket.attempt, self.me.name):
            log.info("job %s: taken over by an idle worker; not started here", ticket.job_id)
            self._end(State.TAKEN_OVER)
        else:
            RESERVATION.move(self, State.HANDED)
            return ticket
        return None

    def _unrenewed(self, ticket: Ticket) -> bool:
        """Not renewed for about a lease's time: it may have lapsed and gone to another worker
        (no DB round trip to ask)."""
        since = time.monotonic() - self._renewed
        if since > self.settings.lease_ttl_s - self.settings.heartbeat_interval_s:
            log.info("job %s: reservation unrenewed for %.0f s: not started", ticket.job_id, since)
            return True
        return False

    def staged_for(self, ticket: Ticket) -> staging.Staged | None:
        """The staged start of `ticket`, now its run's (any other staged job is abandoned)."""
        found, self._staged = self._staged, None
        if found is not None and self.state is State.HANDED and self.id == ticket.job_id:
            return found
        self._abandon(found)
        return None

    def closed(self, ticket: Ticket, how: State) -> None:
        """The handed job's run says how it went: its start recorded (*started*), refused
        (*lost*), or never reached (*not_started*). Its claim decides nothing any more."""
        if self.state is State.HANDED and self.id == ticket.job_id:
            RESERVATION.move(self, how)
            self.claims.forget(ticket.job_id, ticket.attempt, self.me.name)

    def release(self) -> None:
        """The loop ends: give back a reservation still waiting."""
        if self.state in WAITING:
            self._end(State.GIVEN_BACK)
        self._abandon(self._staged)
        self._staged = None

    def _end(self, how: State) -> None:
        ticket = self.ticket
        assert ticket is not None
        RESERVATION.move(self, how)
        staged, self._staged = self._staged, None
        self._abandon(staged)
        if how is not State.LOST:
            self._give_back(ticket)
        self.claims.forget(ticket.job_id, ticket.attempt, self.me.name)

    def _give_back(self, ticket: Ticket) -> None:
        """The reserved job waits in its place in the queue again."""
        try:
            with self.stores.ops_session() as session:
                reservations.release(session, ticket.job_id, self.me.name)
        except Exception:  # the reaper returns it to the queue when its lease lapses
            log.warning("job %s: reservation not released", ticket.job_id, exc_info=True)

    def _abandon(self, staged: staging.Staged | None) -> None:
        if staged is not None:
            staged.abandon()
            self.discard(staged.job.runtime)

    # -- as an idle worker --------------------------------------------------------------------

    def may_take_over(self, job: Job, reservation: Lease) -> bool:
        """For `jobs.lease_next`, as an idle worker: may this worker take over `job`, which
        `reservation`'s worker of this host reserved? Only while that one has not started it."""
        return self.claims.take(job.id, job.attempts or 0, reservation.worker)
