"""The cycle machine: `advance(cycle)` runs the step for the cycle's state (`steps.BY_STATE`)
until the cycle waits (for its job, a review, a budget) or ends, recording each attempt as a
step row. It is idempotent: each step looks up what is already done (commits, pushes, PRs and
findings are looked up before they are redone), so it can be called again after any crash.

It owns its transactions, unlike the rest of the service: a step's work is git, the forge and
subprocesses, which must never run inside an open transaction (a lock held for minutes, a
connection pinned, a rollback that cannot undo a push). So the machine and its steps open short
sessions around those effects, each committing a small, consistent move of the cycle.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from app import broker, db
from app.cycles import lifecycle, notices, repository, service
from app.cycles.exceptions import Transient
from app.cycles.models import CycleStep
from app.cycles.states import SETTLED
from app.cycles.steps import BY_STATE
from app.cycles.steps.base import Step
from app.db import Stores
from app.errors import AutopilotError
from app.redaction import redact_text
from app.settings import Settings

log = logging.getLogger(__name__)

MAX_STEP_ATTEMPTS = 5


@dataclass
class Machine:
    stores: Stores
    settings: Settings

    def advance(self, cycle_id: int) -> str:
        """Run steps until the cycle waits (for its job, a review, a budget) or ends."""
        with self._lock(cycle_id):
            done: CycleStep | None = None  # a step that moved the cycle, its row still "started"
            first: str | None = None  # the state this call found: a move to a wait is news
            while True:
                state, step, attempt = self._next(cycle_id, done)
                first, done = first or state, None
                if step is None or attempt is None:
                    if state != first:
                        notices.announce(self.stores, self.settings, cycle_id, state)
                        if state in SETTLED:
                            self._ring_campaign(cycle_id)
                    return state
                try:
                    try:
                        moved = step(self.stores, self.settings).run(cycle_id)
                    except OperationalError as exc:
                        if not db.lock_contention(exc):
                            raise
                        # SQLite refused a write for a concurrent writer: the step is
                        # idempotent, so it runs again shortly, like any passing fault.
                        raise Transient(f"the store was busy: {exc.orig}") from exc
                except Transient as exc:
                    self._end(attempt, "retry", str(exc))
                    if attempt.attempt >= MAX_STEP_ATTEMPTS:
                        self._fail(
                            cycle_id, f"{state}: gave up after {attempt.attempt} tries: {exc}"
                        )
                        continue
                    broker.ring_advance(self.settings, cycle_id, countdown=2**attempt.attempt)
                    return state
                except AutopilotError as exc:
                    self._end(attempt, "failed", exc.detail)
                    self._fail(cycle_id, f"{state}: {exc.detail}")
                    continue
                except Exception as exc:  # a bug or a missing piece: fail it, never hang
                    log.exception("cycle %s: step %s crashed", cycle_id, state)
                    detail = f"{type(exc).__name__}: {exc}"
                    self._end(attempt, "failed", detail)
                    self._fail(cycle_id, f"{state}: unexpected error: {detail}")
                    continue
                if not moved:
                    self._end(attempt, "waiting", None)
                    return state
                done = attempt

    def _next(
        self, cycle_id: int, done: CycleStep | None
    ) -> tuple[str, type[Step] | None, CycleStep | None]:
        """In one short session: the step that just moved the cycle recorded as done, the
        cycle's state read, and the attempt of the step for that state begun (none where no
        step runs from it). One transaction where three followed each other with nothing
        between them; none is held while a step runs."""
        with self.stores.ops_session() as session:
            if done is not None:
                self._record_end(session, done, "done", None)
            state = repository.state_of(session, cycle_id)
            if state is None:
                service.get(session, cycle_id)  # raises CycleNotFound, naming the cycle
                raise AssertionError("unreachable")  # pragma: no cover
            step = BY_STATE.get(state)
            return state, step, repository.begin_step(session, cycle_id, state) if step else None

    @contextlib.contextmanager
    def _lock(self, cycle_id: int) -> Iterator[None]:
        # One advancer per cycle at a time on this control host; duplicates wait, then find
        # the work done. (Several control hosts would use a PostgreSQL advisory lock.)
        folder = self.settings.state_dir.absolute() / "cycles"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{cycle_id}.lock", "a+b") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _ring_campaign(self, cycle_id: int) -> None:
        """A campaign's cycle settled: its campaign decides what comes next."""
        with self.stores.ops_session() as session:
            campaign_id = repository.campaign_of(session, cycle_id)
        if campaign_id is not None:
            broker.ring_campaign(self.settings, campaign_id)

    def _end(self, step: CycleStep, status: str, detail: str | None) -> None:
        with self.stores.ops_session() as session:
            self._record_end(session, step, status, detail)

    @staticmethod
    def _record_end(session: Session, step: CycleStep, status: str, detail: str | None) -> None:
        repository.end_step(session, step.id, status, redact_text(detail) if detail else None)

    def _fail(self, cycle_id: int, message: str) -> None:
        with self.stores.ops_session() as session:
            cycle = service.get(session, cycle_id)
            if not lifecycle.allows(cycle.state, "failed"):
                return  # it ended while its step ran (cancelled by a person): that stands
            repository.set_state(session, cycle, "failed", error=redact_text(message))
