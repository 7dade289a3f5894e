"""The service's figures at a glance: queues, workers, jobs, cycles, durations, lease expiries.

One snapshot read from the ops DB (through the repositories) feeds both `/metrics` and
`autopilot status`.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client import values as prometheus_values
from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.cycles import service as cycles
from app.jobs import figures
from app.jobs import service as jobs
from app.settings import Settings

# prometheus-client's own multi-process mode: when PROMETHEUS_MULTIPROC_DIR names a folder shared
# by the API and the workers (docker-compose.yml does), each process writes its counts there and
# /metrics sums them; otherwise the counter is this process's. The folder must exist before the
# first metric is created, hence here, at import.
MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if MULTIPROC_DIR:
    Path(MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)
    # Each process's file is named by its identifier: the pid alone clashes across containers
    # sharing the folder (every container's first process has the same small pid), so one
    # container's counts would overwrite another's. Host name and pid are unique per process.
    prometheus_values.ValueClass = prometheus_values.MultiProcessValue(  # type: ignore[no-untyped-call]
        lambda: f"{socket.gethostname()}-{os.getpid()}"
    )

FORGE_ERRORS = Counter(
    "autopilot_forge_errors",
    "Errors from the forge (git push, pull request calls), by forge and operation.",
    ["forge", "operation"],
    registry=None,  # registered into each request's registry, never a global one
)

# The API's own requests, by method, route template (never the raw path: ids would make a series
# each) and status; and their latency.
HTTP_REQUESTS = Counter(
    "autopilot_http_requests",
    "API requests by method, route and status.",
    ["method", "route", "status"],
    registry=None,
)
HTTP_LATENCY = Histogram(
    "autopilot_http_request_duration_seconds",
    "API request latency by method and route.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=None,
)

# Buckets of the job duration histogram (GPU seconds): a kernel benchmark to a day-long run.
DURATION_BUCKETS_S: tuple[float, ...] = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)


# -- the figures, read from the ops DB -----------------------------------------------------


@dataclass
class QueueFigures:
    queue: str
    queued: int  # waiting for a GPU: queued, or reserved by a busy worker (not started)
    running: int  # leased or running: holding a GPU
    oldest_age_s: float | None
    idle_gap_median_s: float | None
    duty_cycle: float | None


@dataclass
class WorkerFigures:
    name: str
    kind: str
    host: str
    device: str
    current_job_id: int | None
    last_seen: datetime
    last_seen_age_s: float


@dataclass
class DurationFigures:
    queue: str
    count: int
    sum_s: float
    # Cumulative counts: jobs whose GPU seconds were <= each bound of DURATION_BUCKETS_S.
    le_counts: list[int]


@dataclass
class Snapshot:
    taken_at: datetime
    queues: list[QueueFigures]
    workers: list[WorkerFigures]
    jobs: dict[str, dict[str, int]]  # queue -> state -> count
    cycles: dict[str, int] | None  # None while the ops DB has no cycle table
    durations: list[DurationFigures]
    lease_expiries: dict[str, int]  # queue -> expiries (see lease_expiries)
    forge_errors: dict[str, float] = field(default_factory=dict)

    def jobs_by_state(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for states in self.jobs.values():
            for state, count in states.items():
                totals[state] = totals.get(state, 0) + count
        return dict(sorted(totals.items()))

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["jobs_by_state"] = self.jobs_by_state()
        return json.loads(json.dumps(data, default=_iso))  # type: ignore[no-any-return]


def _iso(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def take_snapshot(session: Session, settings: Settings) -> Snapshot:
    now = utcnow()
    queues = []
    for entry in figures.queues(session, settings):
        oldest = entry["oldest_queued_at"]
        queues.append(
            QueueFigures(
                queue=entry["queue"],
                queued=int(entry["queued"]) + int(entry["reserved"]),
                running=int(entry["leased"]) + int(entry["running"]),
                oldest_age_s=max(0.0, (now - oldest).total_seconds()) if oldest else None,
                idle_gap_median_s=entry["idle_gap_median_s"],
                duty_cycle=entry["duty_cycle"],
            )
        )
    workers = []
    for row in jobs.list_workers(session):
        last_seen = aware(row.last_seen) or now
        workers.append(
            WorkerFigures(
                name=row.name,
                kind=row.kind,
                host=row.host,
                device=row.devices,
                current_job_id=row.current_job_id,
                last_seen=last_seen,
                last_seen_age_s=max(0.0, (now - last_seen).total_seconds()),
            )
        )
    return Snapshot(
        taken_at=now,
        queues=queues,
        workers=workers,
        jobs=figures.counts_by_queue_and_state(session),
        cycles=cycles.counts_by_state(session),
        durations=[
            DurationFigures(queue=queue, count=count, sum_s=sum_s, le_counts=le_counts)
            for queue, count, sum_s, le_counts in figures.duration_histogram(
                session, DURATION_BUCKETS_S
            )
        ],
        lease_expiries=figures.lease_expiries(session),
        forge_errors=forge_error_counts(),
    )


def forge_error_counts() -> dict[str, float]:
    """This process's forge errors as `forge/operation` -> count (the status command's view)."""
    counts: dict[str, float] = {}
    for metric in FORGE_ERRORS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                key = f"{sample.labels['forge']}/{sample.labels['operation']}"
                counts[key] = sample.value
    return counts
