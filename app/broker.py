"""Celery configuration and the doorbells the control plane rings.

The app only *sends* tasks by name (it never imports `workers`); `workers.celery_app` builds the
consuming app from the same configuration. A message is a doorbell: the ops DB holds the state.
"""

from __future__ import annotations

import functools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]

from app.settings import Settings

log = logging.getLogger(__name__)

RUN_JOBS = "autopilot.run_jobs"
REAP = "autopilot.reap"
ADVANCE_CYCLE = "autopilot.advance_cycle"
ADVANCE_CYCLES = "autopilot.advance_cycles"
ADVANCE_CAMPAIGN = "autopilot.advance_campaign"
MERGE_CYCLE = "autopilot.merge_cycle"
SCHEDULE_TICK = "autopilot.schedule_tick"

# A doorbell that waited this long is dropped by the worker; the reaper rings again if the job
# still needs it, so nothing is lost and stale doorbells do not pile up.
DOORBELL_EXPIRES_S = 3600
# New cycles' advance doorbells sent together at most this often (see `Coalescer`).
DOORBELL_WINDOW_S = 0.02


def celery_config(settings: Settings) -> dict[str, Any]:
    transport: dict[str, Any] = {
        # Redis redelivers an unacked message after this long. It must outlast the longest job,
        # or a running job's doorbell is delivered to a second worker (harmless, the lease
        # check makes it a no-op, but wasteful); Celery reads it from broker_transport_options.
        "visibility_timeout": int(settings.max_job_time_limit_s + 3600),
    }
    if settings.broker_url.startswith("filesystem://"):
        folder = settings.broker_dir
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        _seed_exchange_tables(folder / "control")
        transport = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            # The default 1 s makes every hop take a second; 10 ms costs little CPU.
            "polling_interval": 0.01,
        }
    extra: dict[str, Any] = {}
    if settings.broker_url.startswith("filesystem://"):
        extra["broker_transport"] = "app.broker_fs:Transport"
    gpu_queues = [Queue(f"gpu.{kind}", routing_key=f"gpu.{kind}") for kind in settings.gpu_kinds]
    return {
        "broker_url": settings.broker_url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        **extra,
        "task_queues": [Queue("control"), *gpu_queues],
        "task_default_queue": "control",
        "task_routes": {
            REAP: {"queue": "control"},
            ADVANCE_CYCLE: {"queue": "control"},
            ADVANCE_CYCLES: {"queue": "control"},
            ADVANCE_CAMPAIGN: {"queue": "control"},
            MERGE_CYCLE: {"queue": "control"},
            SCHEDULE_TICK: {"queue": "control"},
            # RUN_JOBS is sent to the job's own gpu.<kind> queue explicitly.
        },
        # The DB holds results and state; a result backend would be a second truth.
        "task_ignore_result": True,
        # Ack after the task ran, so a worker that dies mid-task leaves the doorbell to be
        # redelivered (Redis) instead of lost with it.
        "task_acks_late": True,
        # ...and a worker process killed by a signal requeues its message rather than acking it.
        "task_reject_on_worker_lost": True,
        # One message at a time per worker: a GPU worker must not hoard doorbells it cannot run.
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        # Off by default; the control worker turns them on with Redis (`--task-events`, for
        # Flower). Sent events too, so Flower sees a task from the moment it is queued.
        "worker_send_task_events": False,
        "task_send_sent_event": settings.broker_url.startswith(("redis://", "rediss://")),
        "beat_schedule": {
            "schedule": {
                "task": SCHEDULE_TICK,
                "schedule": settings.schedule_tick_s,
                "options": {"expires": settings.schedule_tick_s * 2},
            },
            "reap": {
                "task": REAP,
                "schedule": settings.reaper_interval_s,
                "options": {"expires": settings.reaper_interval_s * 2},
            },
        },
        "beat_schedule_filename": str(settings.state_dir.absolute() / "celerybeat-schedule"),
    }


# kombu's filesystem transport creates an exchange table with open("wb") and locks it only
# afterwards, so a second process starting at the same moment can read the empty file and die
# on a JSONDecodeError. Seeding every table atomically makes all processes take its locked
# read-modify-write path instead.
_EXCHANGES = ("control", "celery", "celery.pidbox", "reply.celery.pidbox", "celeryev")


def _seed_exchange_tables(folder: Path) -> None:
    for name in _EXCHANGES:
        table = folder / f"{name}.exchange"
        if table.exists():
            continue
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".seed-")
        with os.fdopen(fd, "w") as handle:
            handle.write("[]")
        try:
            os.link(tmp, table)  # atomic, and fails if another process seeded it first
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)


@functools.lru_cache(maxsize=8)
def _client(settings_json: str) -> Celery:
    settings = Settings.model_validate_json(settings_json)
    celery = Celery("autopilot")
    celery.conf.update(celery_config(settings))
    return celery


def client(settings: Settings) -> Celery:
    """A producer-only Celery app for these settings (cached)."""
    return _client(settings.model_dump_json())


def ring_gpu(settings: Settings, queue: str) -> None:
    """Work for `queue`: a GPU worker of that kind prepares it on its host, then runs it."""
    client(settings).send_task(RUN_JOBS, args=[queue], queue=queue, expires=DOORBELL_EXPIRES_S)


def ring_advance(settings: Settings, cycle_id: int, countdown: float | None = None) -> None:
    client(settings).send_task(
        ADVANCE_CYCLE,
        args=[cycle_id],
        queue="control",
        expires=DOORBELL_EXPIRES_S,
        countdown=countdown,
    )


def ring_campaign(settings: Settings, campaign_id: int) -> None:
    """Ring a campaign's driver (`app/cycles/campaigns/driver.py`): one of its cycles settled."""
    client(settings).send_task(
        ADVANCE_CAMPAIGN, args=[campaign_id], queue="control", expires=DOORBELL_EXPIRES_S
    )


def ring_merge(settings: Settings, cycle_id: int) -> None:
    client(settings).send_task(
        MERGE_CYCLE, args=[cycle_id], queue="control", expires=DOORBELL_EXPIRES_S
    )


def ring_advance_many(settings: Settings, cycle_ids: list[int]) -> None:
    """One doorbell for several cycles: the control worker rings each one's own (so they still
    advance in parallel); a single cycle gets its own doorbell straight away."""
    if len(cycle_ids) == 1:
        ring_advance(settings, cycle_ids[0])
    elif cycle_ids:
        client(settings).send_task(
            ADVANCE_CYCLES, args=[cycle_ids], queue="control", expires=DOORBELL_EXPIRES_S
        )


class Coalescer:
    """Rings the advance doorbell for new cycles off the request path, at most once per
    `window_s`: a trigger adds its cycle id (microseconds); a background thread sends what
    gathered, at once when the last ring is older than the window, else when the window ends.
    A burst of triggers costs one broker message per window instead of one each.

    Ids not yet sent when the process dies are rung again by the reaper (their cycles stay
    `planned`, untouched), as any lost doorbell is; `close` sends what is pending."""

    def __init__(
        self, ring: Callable[[list[int]], None], window_s: float = DOORBELL_WINDOW_S
    ) -> None:
        self._ring = ring
        self.window_s = window_s
        self._pending: list[int] = []
        self._cond = threading.Condition()
        self._closed = False
        self._last = float("-inf")
        self._thread: threading.Thread | None = None

    def add(self, cycle_id: int) -> None:
        with self._cond:
            if self._closed:  # shutting down, after the cycle's commit: the reaper rings it
                log.warning("cycle %s: advance doorbell not sent (shutting down)", cycle_id)
                return
            self._pending.append(cycle_id)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="advance-doorbell", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is pending and stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return  # closed, nothing left
                closing = self._closed
            wait = self._last + self.window_s - time.monotonic()
            if wait > 0 and not closing:
                time.sleep(wait)  # gather the rest of the window's triggers
            with self._cond:
                batch, self._pending = self._pending, []
            self._last = time.monotonic()
            try:
                self._ring(batch)
            except Exception:  # the broker is down: the reaper rings these cycles again
                log.warning("advance doorbell for cycles %s not sent", batch, exc_info=True)
