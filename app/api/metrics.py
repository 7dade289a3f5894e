"""`GET /metrics`: the ops figures (app.status) in Prometheus's exposition format."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from fastapi import APIRouter, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from app.api.deps import SettingsDep, StoresDep, bearer_token
from app.api.problems import problem_response
from app.db import Stores
from app.errors import PROBLEM_BASE
from app.projects import service as ops
from app.settings import Settings
from app.status import (
    DURATION_BUCKETS_S,
    FORGE_ERRORS,
    HTTP_LATENCY,
    HTTP_REQUESTS,
    MULTIPROC_DIR,
    Snapshot,
    take_snapshot,
)


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


def _authorize(request: Request, stores: Stores, settings: Settings) -> None:
    presented = bearer_token(request)
    wanted = settings.metrics_token
    if (
        wanted is not None
        and presented
        and hmac.compare_digest(presented.encode(), wanted.get_secret_value().encode())
    ):
        return
    with stores.ops_session() as session:  # an API token that may read
        ops.require_reader(ops.authenticate(session, presented))


@metrics_router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 503: {"description": "DB down"}},
)
def metrics(
    request: Request,
    stores: StoresDep,
    settings: SettingsDep,
) -> Response:
    """Prometheus exposition of the ops figures, the API's requests by route and the process's
    own figures. It names worker hosts, so it needs a token unless AUTOPILOT_METRICS_AUTH=public
    (a scrape-only bind): the AUTOPILOT_METRICS_TOKEN, or any API token that may read."""
    if settings.metrics_auth == "token":
        _authorize(request, stores, settings)
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
    if MULTIPROC_DIR:
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry, path=MULTIPROC_DIR)  # type: ignore[no-untyped-call]
    else:
        for own in (FORGE_ERRORS, HTTP_REQUESTS, HTTP_LATENCY):
            registry.register(own)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
