"""GET /metrics: the ops figures in the Prometheus text format, read from the DB per request."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from app.api.main import create_app
from app.cycles.repository import counts_by_state as cycles_by_state
from app.db import Stores
from app.projects import service as ops
from app.settings import Settings
from app.status import FORGE_ERRORS
from tests.support import bearer


def scrape(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def finished(gpu_seconds: float, attempts: int = 1, state: str = "succeeded") -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "state": state,
        "attempts": attempts,
        "gpu_seconds": gpu_seconds,
        "started_at": now - timedelta(seconds=gpu_seconds + 1),
        "finished_at": now - timedelta(seconds=1),
    }


def test_metrics_reports_jobs_and_queues(
    metrics_client: TestClient, add_job: Callable[..., int]
) -> None:
    old = datetime.now(UTC) - timedelta(seconds=600)
    add_job(state="queued", submitted_at=old)
    add_job(state="queued")
    add_job(state="running", attempts=1)
    add_job(**finished(3.0))
    add_job(**finished(120.0, attempts=3))  # two leases lapsed before it finished
    add_job(
        queue="gpu.h100",
        state="failed",
        attempts=3,
        error="lease expired 3 times (worker w on h stopped heartbeating); giving up",
    )

    s = scrape(metrics_client)

    assert s[("autopilot_jobs", (("queue", "gpu.cpu"), ("state", "queued")))] == 2
    assert s[("autopilot_jobs", (("queue", "gpu.cpu"), ("state", "running")))] == 1
    assert s[("autopilot_jobs", (("queue", "gpu.cpu"), ("state", "succeeded")))] == 2
    assert s[("autopilot_jobs", (("queue", "gpu.h100"), ("state", "failed")))] == 1
    assert s[("autopilot_queue_depth", (("queue", "gpu.cpu"),))] == 2
    assert s[("autopilot_queue_running", (("queue", "gpu.cpu"),))] == 1
    assert s[("autopilot_queue_depth", (("queue", "gpu.a100"),))] == 0  # configured, empty
    oldest = s[("autopilot_queue_oldest_age_seconds", (("queue", "gpu.cpu"),))]
    assert 590 <= oldest <= 3600
    assert s[("autopilot_queue_oldest_age_seconds", (("queue", "gpu.a100"),))] == 0
    # The duration histogram: two finished jobs, 3 s and 120 s of GPU time.
    assert s[("autopilot_job_duration_seconds_count", (("queue", "gpu.cpu"),))] == 2
    assert s[("autopilot_job_duration_seconds_sum", (("queue", "gpu.cpu"),))] == 123.0
    assert s[("autopilot_job_duration_seconds_bucket", (("le", "5.0"), ("queue", "gpu.cpu")))] == 1
    assert (
        s[("autopilot_job_duration_seconds_bucket", (("le", "300.0"), ("queue", "gpu.cpu")))] == 2
    )
    assert s[("autopilot_job_duration_seconds_bucket", (("le", "+Inf"), ("queue", "gpu.cpu")))] == 2
    # Lease expiries (derived): 2 extra attempts on gpu.cpu; on gpu.h100 2 extra + the last one.
    assert s[("autopilot_lease_expiries_total", (("queue", "gpu.cpu"),))] == 2
    assert s[("autopilot_lease_expiries_total", (("queue", "gpu.h100"),))] == 3


def test_idle_gap_and_workers(
    metrics_client: TestClient, add_job: Callable[..., int], add_worker: Callable[..., None]
) -> None:
    now = datetime.now(UTC)
    for gap, start in ((0.2, 30), (0.4, 20), (3.0, 10)):
        add_job(
            **finished(5.0),
            idle_gap_s=gap,
            first_line_at=now - timedelta(seconds=start),
        )
    add_worker("gpu-cpu-0@host-a", "0", None, seen_ago_s=2)

    s = scrape(metrics_client)

    assert s[("autopilot_gpu_idle_gap_seconds", (("queue", "gpu.cpu"),))] == 0.4
    assert 0 < s[("autopilot_gpu_duty_cycle", (("queue", "gpu.cpu"),))] <= 1
    seen = s[
        (
            "autopilot_worker_last_seen_age_seconds",
            (("host", "host-a"), ("kind", "cpu"), ("worker", "gpu-cpu-0@host-a")),
        )
    ]
    assert 2 <= seen < 120


def test_forge_errors_counter_is_exported(metrics_client: TestClient) -> None:
    labels = (("forge", "github"), ("operation", "open_pull_request"))
    before = scrape(metrics_client).get(("autopilot_forge_errors_total", labels), 0.0)
    FORGE_ERRORS.labels(forge="github", operation="open_pull_request").inc()
    FORGE_ERRORS.labels(forge="github", operation="open_pull_request").inc()
    assert scrape(metrics_client)[("autopilot_forge_errors_total", labels)] == before + 2


def test_cycles_by_state(metrics_client: TestClient, stores: Stores, project_id: int) -> None:
    from app.cycles.models import Cycle

    with stores.ops_session() as session:
        for state in ("planned", "done", "done"):
            session.add(Cycle(project_id=project_id, state=state))

    s = scrape(metrics_client)

    got = {
        dict(labels)["state"]: v for (name, labels), v in s.items() if name == "autopilot_cycles"
    }
    assert got == {"planned": 1, "done": 2}


def test_no_cycle_table_means_no_cycle_figures(tmp_path: Any) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'bare.db'}")
    from sqlalchemy.orm import Session

    with Session(engine) as session:
        assert cycles_by_state(session) is None
        session.execute(text("CREATE TABLE cycle (id INTEGER PRIMARY KEY, state TEXT)"))
        session.execute(text("INSERT INTO cycle (state) VALUES ('running')"))
        assert cycles_by_state(session) == {"running": 1}
    engine.dispose()


def test_metrics_answers_503_when_the_ops_store_is_gone(
    metrics_client: TestClient, stores: Stores
) -> None:
    from sqlalchemy import create_engine as make

    gone = make("postgresql+psycopg://nobody@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    original = stores.ops_engine
    stores.ops_engine = gone
    stores.__post_init__()
    try:
        response = metrics_client.get("/metrics")
    finally:
        stores.ops_engine = original
        stores.__post_init__()
        gone.dispose()
    assert response.status_code == 503
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith("/not-ready")


def test_metrics_needs_a_token_unless_made_public(
    settings: Settings, stores: Stores, metrics_client: TestClient
) -> None:
    """Issue 20, item 9: /metrics names worker hosts; the scraper's token or a reading API
    token, unless AUTOPILOT_METRICS_AUTH=public."""
    with stores.ops_session() as session:
        _, reader = ops.create_token(session, "reader", ["review"])
        _, worker = ops.create_token(session, "gpu-host", ["worker"])
    with TestClient(create_app(settings, stores)) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer("scrape-only-secret")).status_code == 401
        assert client.get("/metrics", headers=bearer(reader)).status_code == 200
        assert client.get("/metrics", headers=bearer(worker)).status_code == 403
    assert metrics_client.get("/metrics").status_code == 200  # the scraper's own token
    public = settings.model_copy(update={"metrics_auth": "public"})
    with TestClient(create_app(public, stores)) as client:
        assert client.get("/metrics").status_code == 200


def test_requests_are_counted_by_route_and_the_process_is_described(
    metrics_client: TestClient,
) -> None:
    metrics_client.get("/healthz")
    metrics_client.get("/api/v1/cycles/12345")  # no token on this route: a 401, by template
    s = scrape(metrics_client)
    healthz = (("method", "GET"), ("route", "/healthz"), ("status", "200"))
    assert s[("autopilot_http_requests_total", healthz)] >= 1
    by_template = (("method", "GET"), ("route", "/api/v1/cycles/{cycle_id}"), ("status", "401"))
    assert s[("autopilot_http_requests_total", by_template)] >= 1
    assert not [k for k in s if "12345" in str(k)]  # never the raw path
    latency = (
        "autopilot_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/healthz")),
    )
    assert s[latency] >= 1
    assert s[("process_resident_memory_bytes", ())] > 0
    assert any(name == "python_info" for name, _ in s)
