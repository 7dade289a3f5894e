"""What operators watch: `/metrics` for Prometheus, JSON logs carrying cycle and job ids with
secrets masked, and `autopilot status` for the same figures at a glance in a terminal.

Every figure is read from the ops DB when asked for, so the API, the workers and the CLI agree
whichever process answers; the only in-process state is the forge error counter.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import unquote, urlsplit

import typer
from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import case, func, inspect, select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.api.deps import get_settings, get_stores
from app.api.problems import problem_response
from app.db import Stores
from app.errors import PROBLEM_BASE
from app.ops import jobs
from app.ops.models import Job
from app.settings import Settings, redact_text

# -- counters the code increments ----------------------------------------------------------

# prometheus-client's own multi-process mode: when PROMETHEUS_MULTIPROC_DIR names a folder shared
# by the API and the workers (docker-compose.yml does), each process writes its counts there and
# /metrics sums them; otherwise the counter is this process's. The folder must exist before the
# first metric is created, hence here, at import.
_MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
if _MULTIPROC_DIR:
    Path(_MULTIPROC_DIR).mkdir(parents=True, exist_ok=True)

FORGE_ERRORS = Counter(
    "autopilot_forge_errors",
    "Errors from the forge (git push, pull request calls), by forge and operation.",
    ["forge", "operation"],
    registry=None,  # registered into each request's registry, never a global one
)

# Buckets of the job duration histogram (GPU seconds): a kernel benchmark to a day-long run.
DURATION_BUCKETS_S: tuple[float, ...] = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
RAN = ("succeeded", "failed", "cancelled")


# -- the figures, read from the ops DB -----------------------------------------------------


@dataclass
class QueueFigures:
    queue: str
    queued: int
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


def cycles_by_state(session: Session) -> dict[str, int] | None:
    """Cycle counts by state, or None when the ops DB has no `cycle` table (yet)."""
    if not inspect(session.connection()).has_table("cycle"):
        return None
    rows = session.execute(text("SELECT state, COUNT(*) FROM cycle GROUP BY state"))
    return {str(state): int(count) for state, count in rows}


def jobs_by_queue_and_state(session: Session) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    rows = session.execute(
        select(Job.queue, Job.state, func.count()).group_by(Job.queue, Job.state)
    )
    for queue, state, count in rows:
        counts.setdefault(queue, {})[state] = int(count)
    return counts


def job_durations(session: Session) -> list[DurationFigures]:
    """GPU seconds of every job that ran and finished: a cumulative histogram per queue."""
    ran = Job.gpu_seconds
    columns = [func.sum(case((ran <= bound, 1), else_=0)) for bound in DURATION_BUCKETS_S]
    rows = session.execute(
        select(Job.queue, func.count(), func.coalesce(func.sum(ran), 0.0), *columns)
        .where(Job.state.in_(RAN), Job.started_at.is_not(None), Job.finished_at.is_not(None))
        .group_by(Job.queue)
    )
    return [
        DurationFigures(
            queue=row[0],
            count=int(row[1]),
            sum_s=float(row[2]),
            le_counts=[int(n or 0) for n in row[3:]],
        )
        for row in rows
    ]


def lease_expiries(session: Session) -> dict[str, int]:
    """Leases that lapsed, per queue. A proxy: nothing counts expiries themselves, but a job is
    leased again only after its lease expired, so every attempt beyond the first is one expiry,
    plus the last one of each job the reaper gave up on."""
    extra_attempts = func.sum(case((Job.attempts > 1, Job.attempts - 1), else_=0))
    given_up = func.sum(
        case(((Job.state == "failed") & Job.error.like("lease expired%"), 1), else_=0)
    )
    rows = session.execute(select(Job.queue, extra_attempts, given_up).group_by(Job.queue))
    return {queue: int(again or 0) + int(gave_up or 0) for queue, again, gave_up in rows}


def take_snapshot(session: Session, settings: Settings) -> Snapshot:
    now = jobs.utcnow()
    queues = []
    for entry in jobs.queues(session, settings):
        oldest = entry["oldest_queued_at"]
        queues.append(
            QueueFigures(
                queue=entry["queue"],
                queued=int(entry["queued"]),
                running=int(entry["leased"]) + int(entry["running"]),
                oldest_age_s=max(0.0, (now - oldest).total_seconds()) if oldest else None,
                idle_gap_median_s=entry["idle_gap_median_s"],
                duty_cycle=entry["duty_cycle"],
            )
        )
    workers = []
    for row in jobs.list_workers(session):
        last_seen = jobs.aware(row.last_seen) or now
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
        jobs=jobs_by_queue_and_state(session),
        cycles=cycles_by_state(session),
        durations=job_durations(session),
        lease_expiries=lease_expiries(session),
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


# -- /metrics ------------------------------------------------------------------------------


class SnapshotCollector(Collector):
    """Turns one snapshot into Prometheus metric families; built per request, never shared."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        s = self.snapshot
        if s.cycles is not None:
            cycles = GaugeMetricFamily("autopilot_cycles", "Cycles by state.", labels=["state"])
            for state, count in sorted(s.cycles.items()):
                cycles.add_metric([state], count)
            yield cycles
        jobs_g = GaugeMetricFamily(
            "autopilot_jobs", "Jobs by queue and state.", labels=["queue", "state"]
        )
        for queue, states in sorted(s.jobs.items()):
            for state, count in sorted(states.items()):
                jobs_g.add_metric([queue, state], count)
        yield jobs_g
        depth = GaugeMetricFamily(
            "autopilot_queue_depth", "Jobs waiting for a GPU.", labels=["queue"]
        )
        running = GaugeMetricFamily(
            "autopilot_queue_running", "Jobs holding a GPU (leased or running).", labels=["queue"]
        )
        oldest = GaugeMetricFamily(
            "autopilot_queue_oldest_age_seconds",
            "Age of the oldest waiting job; 0 when none waits.",
            labels=["queue"],
        )
        idle = GaugeMetricFamily(
            "autopilot_gpu_idle_gap_seconds",
            "Median idle gap between back-to-back jobs with demand waiting (last hour).",
            labels=["queue"],
        )
        duty = GaugeMetricFamily(
            "autopilot_gpu_duty_cycle",
            "Busy time over wall time across back-to-back jobs (last hour).",
            labels=["queue"],
        )
        for q in s.queues:
            depth.add_metric([q.queue], q.queued)
            running.add_metric([q.queue], q.running)
            oldest.add_metric([q.queue], q.oldest_age_s or 0.0)
            if q.idle_gap_median_s is not None:
                idle.add_metric([q.queue], q.idle_gap_median_s)
            if q.duty_cycle is not None:
                duty.add_metric([q.queue], q.duty_cycle)
        yield from (depth, running, oldest, idle, duty)
        durations = HistogramMetricFamily(
            "autopilot_job_duration_seconds",
            "GPU seconds of finished jobs.",
            labels=["queue"],
        )
        for d in s.durations:
            buckets = [
                (str(float(b)), n) for b, n in zip(DURATION_BUCKETS_S, d.le_counts, strict=True)
            ]
            buckets.append(("+Inf", d.count))
            durations.add_metric([d.queue], buckets, d.sum_s)
        yield durations
        expiries = CounterMetricFamily(
            "autopilot_lease_expiries",
            "Leases that lapsed (derived from job attempts).",
            labels=["queue"],
        )
        for queue, count in sorted(s.lease_expiries.items()):
            expiries.add_metric([queue], count)
        yield expiries
        seen = GaugeMetricFamily(
            "autopilot_worker_last_seen_age_seconds",
            "Seconds since each worker last reported.",
            labels=["worker", "kind", "host"],
        )
        for w in s.workers:
            seen.add_metric([w.name, w.kind, w.host], w.last_seen_age_s)
        yield seen


metrics_router = APIRouter(tags=["health"])


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 503: {"description": "DB down"}},
)
def metrics(
    stores: Annotated[Stores, Depends(get_stores)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> Response:
    """Prometheus exposition of the ops figures; public, like /healthz, for the scraper."""
    try:
        with stores.ops_session() as session:
            snapshot = take_snapshot(session, settings)
    except SQLAlchemyError as exc:
        return problem_response(
            {
                "type": PROBLEM_BASE + "not-ready",
                "title": "Not ready",
                "status": 503,
                "detail": f"the ops store is unreachable ({type(exc).__name__}); retry later",
            },
            {"Retry-After": "5"},
        )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    if _MULTIPROC_DIR:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=_MULTIPROC_DIR)  # type: ignore[no-untyped-call]
    else:
        registry.register(FORGE_ERRORS)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


# -- structured logs -----------------------------------------------------------------------

_LOG_CONTEXT: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "autopilot_log_context", default=None
)
CONTEXT_KEYS = ("cycle_id", "job_id")
MASK = "***"
_HANDLER_MARK = "_autopilot_handler"


@contextlib.contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Every record logged inside carries these ids (e.g. `log_context(cycle_id=3, job_id=9)`)."""
    unknown = set(ids) - set(CONTEXT_KEYS)
    if unknown:
        raise ValueError(f"unknown log context keys {sorted(unknown)}; use {CONTEXT_KEYS}")
    token = _LOG_CONTEXT.set({**(_LOG_CONTEXT.get() or {}), **ids})
    try:
        yield
    finally:
        _LOG_CONTEXT.reset(token)


def secret_values(settings: Settings) -> list[str]:
    """The values no log line may show: tokens, the session secret, the passwords in the URLs."""
    found: set[str] = set()
    for secret in (settings.github_token, settings.session_secret):
        if secret is not None and secret.get_secret_value():
            found.add(secret.get_secret_value())
    for url in (settings.memory_database_url, settings.ops_database_url, settings.broker_url):
        try:
            password = urlsplit(url).password
        except ValueError:
            continue
        if password:
            found.update({password, unquote(password)})
    # Very short values would mask ordinary words; URL passwords are also caught by redact_text.
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


class RedactSecrets(logging.Filter):
    """Runs a record's message and traceback through `redact_text` and masks known secrets."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def redact(self, text_: str) -> str:
        text_ = redact_text(text_)
        for secret in self.secrets:
            text_ = text_.replace(secret, MASK)
        return text_

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if isinstance(value, str):
                setattr(record, key, self.redact(value))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and cycle_id/job_id when known."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = _LOG_CONTEXT.get() or {}
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            if value is None:
                value = context.get(key)
            if value is not None:
                entry[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


class ContextTextFormatter(logging.Formatter):
    """The plain-text format, with the ids appended when known."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = _LOG_CONTEXT.get() or {}
        ids = []
        for key in CONTEXT_KEYS:
            value = getattr(record, key, None)
            value = context.get(key) if value is None else value
            if value is not None:
                ids.append(f"{key}={value}")
        return f"{line} [{' '.join(ids)}]" if ids else line


def configure_logging(
    settings: Settings, stream: Any = None, loggers: Sequence[str] = ("uvicorn", "celery")
) -> logging.Handler:
    """Install the one root handler (JSON when AUTOPILOT_LOG_JSON, else text) with redaction.

    Idempotent: a second call replaces the handler it installed. The named framework loggers
    lose their own handlers and propagate to ours, so their lines are formatted and masked too.
    """
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
        old.close()
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    setattr(handler, _HANDLER_MARK, True)
    handler.addFilter(RedactSecrets(secret_values(settings)))
    handler.setFormatter(
        JsonFormatter()
        if settings.log_json
        else ContextTextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    for name in loggers:
        framework = logging.getLogger(name)
        framework.handlers.clear()
        framework.propagate = True
    return handler


# -- `autopilot status` --------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render_status(snapshot: Snapshot, settings: Settings) -> str:
    lines = [f"at {snapshot.taken_at:%Y-%m-%d %H:%M:%S} UTC"]
    lines += ["", "QUEUES", f"  {'queue':14} {'depth':>5} {'oldest':>7} {'running':>7}"]
    lines[-1] += f" {'idle gap':>8} {'duty':>5}"
    for q in snapshot.queues:
        duty = f"{q.duty_cycle:.0%}" if q.duty_cycle is not None else "-"
        lines.append(
            f"  {q.queue:14} {q.queued:>5} {_age(q.oldest_age_s):>7} {q.running:>7}"
            f" {_age(q.idle_gap_median_s):>8} {duty:>5}"
        )
    lines += ["", "WORKERS"]
    if not snapshot.workers:
        lines.append("  none registered")
    stale_after = 3 * settings.heartbeat_interval_s
    for w in snapshot.workers:
        job = f"job {w.current_job_id}" if w.current_job_id is not None else "idle"
        stale = (
            "  (stale)" if w.current_job_id is not None and w.last_seen_age_s > stale_after else ""
        )
        lines.append(
            f"  {w.name:40} device {w.device or '-':5} {job:10} "
            f"seen {_age(w.last_seen_age_s)} ago{stale}"
        )
    by_state = snapshot.jobs_by_state()
    lines += ["", "JOBS", "  " + _counts(by_state)]
    if snapshot.cycles is not None:
        lines += ["", "CYCLES", "  " + _counts(snapshot.cycles)]
    expiries = sum(snapshot.lease_expiries.values())
    lines += ["", f"lease expiries: {expiries}"]
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return "  ".join(f"{state} {count}" for state, count in sorted(counts.items())) or "none"


def status_command(
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object")] = False,
) -> None:
    """Queues, workers, jobs and cycles at a glance (the figures /metrics exports)."""
    from app.cli import echo_json, load_settings  # the CLI imports this module: import late

    settings = load_settings()
    stores = Stores.from_settings(settings)
    try:
        with stores.ops_session() as session:
            snapshot = take_snapshot(session, settings)
    except SQLAlchemyError as exc:
        typer.echo(
            f"error: the ops store is unreachable ({type(exc).__name__}); "
            "check AUTOPILOT_OPS_URL and run `autopilot db upgrade`",
            err=True,
        )
        raise typer.Exit(1) from None
    finally:
        stores.dispose()
    if json_output:
        echo_json(snapshot.as_json())
        return
    typer.echo(render_status(snapshot, settings))
