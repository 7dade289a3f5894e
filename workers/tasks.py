"""Thin task wrappers: each takes ids, opens its own sessions, and calls one service function.

Both workers import this module (the Celery app includes it), but a GPU worker runs only
`run_jobs`: each control task imports its services in its body, so a GPU host loads none of the
control plane (tests/unit/architecture/test_gpu_host_imports.py)."""

from __future__ import annotations

import functools
import logging

from celery.signals import worker_shutdown, worker_shutting_down

from app import broker
from app.db import Stores
from app.settings import get_settings
from workers import lease_gate, prepare
from workers.celery_app import RECONCILE_GITHUB, celery
from workers.gpu.loop import RunLoop
from workers.gpu.tickets import WorkerIdentity
from workers.launcher import confine, execstub
from workers.launcher.spare import SpareSlot

log = logging.getLogger(__name__)

# Set by `autopilot worker gpu` before the worker starts (solo pool: same process).
IDENTITY: WorkerIdentity | None = None
# The GPU worker's parked interpreter for its next job, kept across doorbells.
SPARES = SpareSlot()
# Its background preparer (made at the first doorbell: the queue is known by then).
PREPARER: prepare.Preparer | None = None


@worker_shutting_down.connect
def _drain(**_: object) -> None:
    """SIGTERM (warm shutdown) reached a worker whose task is its loop over the queue: the
    loop ends with the running job (`lease_gate.py`), instead of leasing the next ones."""
    lease_gate.GATE.drain()


@worker_shutdown.connect
def _close_spare(**_: object) -> None:
    SPARES.close()
    execstub.discard()  # an unused one: its process and cgroup
    if PREPARER is not None:
        PREPARER.close()


@functools.lru_cache(maxsize=1)
def stores() -> Stores:
    return Stores.from_settings(get_settings())


@celery.task(name=broker.RUN_JOBS)
def run_jobs(queue: str) -> int:
    """A doorbell for `queue`: run whatever is prepared there, oldest submission first."""
    me = IDENTITY
    if me is None or me.queue != queue:
        log.error("doorbell for %s reached a worker that is not a %s GPU worker", queue, queue)
        return 0
    global PREPARER
    if PREPARER is None:  # this worker's first doorbell
        confine.start_death_watch()
        PREPARER = prepare.Preparer(stores(), get_settings(), me.queue)
    loop = RunLoop(stores(), get_settings(), me, spares=SPARES, preparer=PREPARER, exec_stub=True)
    return loop.run_available()


@celery.task(name=broker.REAP)
def reap() -> dict[str, list[int] | list[str]]:
    from workers import reaper

    reaped = reaper.reap(stores(), get_settings())
    return {"requeued": reaped.requeued, "failed": reaped.failed}


@celery.task(name=broker.ADVANCE_CYCLE)
def advance_cycle(cycle_id: int) -> str:
    from app.cycles.machine import Machine

    return Machine(stores(), get_settings()).advance(cycle_id)


@celery.task(name=broker.ADVANCE_CYCLES)
def advance_cycles(cycle_ids: list[int]) -> list[int]:
    """The API's one doorbell for a burst of new cycles: each gets its own, so the control
    worker's processes advance them in parallel (advancing them here would run them in turn)."""
    for cycle_id in cycle_ids:
        broker.ring_advance(get_settings(), cycle_id)
    return cycle_ids


@celery.task(name=broker.ADVANCE_CAMPAIGN)
def advance_campaign(campaign_id: int) -> str:
    from app.cycles.campaigns.driver import Driver

    return Driver(stores(), get_settings()).advance(campaign_id)


@celery.task(name=broker.MERGE_CYCLE)
def merge_cycle(cycle_id: int) -> str:
    from app.cycles.machine import Machine
    from app.cycles.review import merge_approved

    return merge_approved(Machine(stores(), get_settings()), cycle_id)


@celery.task(name=broker.SCHEDULE_TICK)
def schedule_tick() -> list[int]:
    from app.cycles import schedules

    with stores().ops_session() as session:
        due = schedules.schedule_tick(session, get_settings())
    for cycle_id in due:  # after the commit
        broker.ring_advance(get_settings(), cycle_id)
    return due


@celery.task(name=RECONCILE_GITHUB)
def reconcile_github() -> list[str]:
    """Beat's doorbell: apply the merges and closes on GitHub that no webhook delivered."""
    from app.forge import decisions

    return decisions.reconcile(stores(), get_settings())
