"""The GPU loop's one path that finishes a job, whatever ended it (an exit, its time limit, a
cancel, a lost lease, a failed start): the log into the host's outbox, the outcome through
`jobs.finish` (alone, with the next job's lease, or with the reserved job's start: one
transaction), then the cycle's doorbell and the log's upload."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy.orm import Session

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.settings import Settings
from workers.gpu.tickets import Ticket
from workers.log_outbox import Entry, LogSender

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class Settle:
    """A finished job whose outcome is stored with the next job's lease or start (or alone)."""

    ticket: Ticket
    outcome: jobs.JobOutcome
    stored: bool = False


@dataclass(frozen=True)
class Finished:
    kept: bool  # False: the lease was lost, the outcome discarded
    cycle_id: int | None


class OutcomeRecorder:
    """Finishes jobs for one worker: `record` stores an outcome together with what the loop does
    next in the same transaction, `record_alone` stores it by itself."""

    def __init__(
        self,
        stores: Stores,
        settings: Settings,
        worker: str,
        sender: LogSender,
        queue: str | None = None,
    ) -> None:
        self.stores, self.settings, self.worker, self.sender = stores, settings, worker, sender
        self.queue = queue  # the worker's: a gang's members are free for its jobs again

    def record(self, done: Settle | None, then: Callable[[Session], T]) -> T:
        """Store `done`'s outcome (if any) and run `then` in one transaction; `then`'s value.

        Should the transaction fail (`then` raised: the next lease failed, the reserved start
        was refused), the outcome is stored alone before the error propagates: a job that ran
        is never left to lapse and run again. An outcome already stored is not stored again
        (a reserved job's start tried a second time, after the first try stored it alone).
        """
        if done is not None and done.stored:
            done = None
        entry = self._to_outbox(done)
        finished: Finished | None = None
        try:
            with self.stores.ops_session() as session:
                if done is not None:
                    finished = self._finish(session, done)
                value = then(session)
        except Exception:
            if done is not None:
                self._store_alone(done, entry)
            raise
        if done is not None and finished is not None:
            self._stored(done, finished, entry)
        return value

    def record_alone(self, done: Settle) -> None:
        self._store_alone(done, self._to_outbox(done))

    def _store_alone(self, done: Settle, entry: Entry | None) -> None:
        with self.stores.ops_session() as session:
            finished = self._finish(session, done)
        self._stored(done, finished, entry)

    def _to_outbox(self, done: Settle | None) -> Entry | None:
        """The log waits in the outbox before the outcome is stored: from then on, a worker
        that dies leaves it to the next worker of this host to send."""
        if done is None:
            return None
        return self.sender.outbox.put(done.ticket.job_id, self.worker)

    def _finish(self, session: Session, done: Settle) -> Finished:
        """The outcome through the job's lifecycle (`jobs.finish`)."""
        job_id = done.ticket.job_id
        try:
            job = jobs.finish(session, job_id, self.worker, done.outcome)
        except jobs.LeaseLost:
            log.warning("job %s: lease lost before finishing; outcome discarded", job_id)
            return Finished(kept=False, cycle_id=None)
        return Finished(kept=True, cycle_id=job.cycle_id)

    def _stored(self, done: Settle, finished: Finished, entry: Entry | None) -> None:
        """After the commit (nothing below may make the outcome pending again)."""
        done.stored = True
        if entry is not None:
            if finished.kept:
                self.sender.send_soon(entry)
            else:  # another worker owns the job now: this log is not the job's
                self.sender.outbox.drop(entry)
        self._ring(finished.cycle_id)
        if finished.kept and done.ticket.gpus > 1:
            self._wake_members(done.ticket.gpus - 1)

    def _wake_members(self, count: int) -> None:
        """A gang job ended and its seated workers are free: a doorbell each for the jobs that
        wait (the leader goes on by itself)."""
        if self.queue is None:
            return
        try:
            for _ in range(count):
                broker.ring_gpu(self.settings, self.queue)
        except Exception:  # the broker is away: the reaper re-rings jobs left waiting
            log.warning("doorbells for %s after a gang job not sent", self.queue, exc_info=True)

    def _ring(self, cycle_id: int | None) -> None:
        if cycle_id is None:
            return
        try:
            broker.ring_advance(self.settings, cycle_id)
        except Exception:  # the broker is away: the reaper re-rings stale cycles (cycles.stale)
            log.warning("cycle %s: advance doorbell not sent", cycle_id, exc_info=True)
