"""Restart Redis mid-cycle: the messages it held are gone (`--save ""`), the cycle completes.

The ops DB is the truth and a Redis message only a doorbell (docs/design.md, "Recovery"): after the
restart the workers reconnect and the reaper rings again what was lost.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from tests.conftest import Backend, need_postgres
from tests.integration.queue.conftest import Workers, make_repo
from tests.reliability.conftest import finished, free_port, job, need_tools
from tests.support import bearer, wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(240),
]


def redis_start(port: int, folder: Path) -> list[str]:
    """A Redis of this test's own on `port` (the machine's serves every other test at once),
    started as CI starts its own: no persistence, so a restart loses what it held."""
    return [
        "redis-server",
        "--daemonize",
        "yes",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(folder),
        "--pidfile",
        str(folder / "redis.pid"),
        "--logfile",
        str(folder / "redis.log"),
    ]


def ping(port: int) -> bool:
    try:
        done = subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, timeout=5
        )
    except subprocess.TimeoutExpired:
        return False
    return done.stdout.strip() == "PONG"


def stop_redis(port: int) -> None:
    subprocess.run(
        ["redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True, timeout=10
    )
    wait_for(lambda: not ping(port), timeout=15)


def start_redis(port: int, folder: Path) -> None:
    if not ping(port):
        subprocess.run(redis_start(port, folder), capture_output=True, timeout=30, check=False)
    wait_for(lambda: ping(port), timeout=30, interval=0.1)


@pytest.fixture
def broker_url(backend: Backend, tmp_path: Path) -> Iterator[str]:
    """The workers' broker: on PostgreSQL, a Redis this test may restart."""
    if backend.name == "sqlite":
        yield "filesystem://"
        return
    need_postgres()
    need_tools("redis-cli", "redis-server")
    port, folder = free_port(), tmp_path / "redis"
    folder.mkdir()
    start_redis(port, folder)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_redis(port)


def test_redis_restart_mid_cycle_completes(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    settings = workers.settings
    if not settings.broker_url.startswith(("redis://", "rediss://")):
        pytest.skip("Redis variant only: the filesystem broker has no server to restart")
    port = urlsplit(settings.broker_url).port or 6379
    folder = tmp_path / "redis"
    repo = make_repo(tmp_path, "probe-redis")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        _, token = ops.create_token(session, "ci", ["trigger"])
    workers.start("control", "control", "--beat")
    workers.start("gpu", "gpu", "--kind", "cpu", "--device", "0")

    with TestClient(create_app(settings, stores), raise_server_exceptions=False) as client:
        created = client.post(
            "/api/v1/cycles",
            headers=bearer(token),
            json={"project": repo.name, "experiment": "probe", "parameters": {"sleep_s": 3}},
        )
        assert created.status_code == 201, created.text
        cycle_id = created.json()["id"]

        def cycle() -> dict[str, Any]:
            body: dict[str, Any] = client.get(
                f"/api/v1/cycles/{cycle_id}", headers=bearer(token)
            ).json()
            return body

        # Mid-cycle: its job runs on the GPU worker (the experiment has started).
        job_id = wait_for(lambda: cycle()["job_id"], timeout=60)
        started = wait_for(
            lambda: (row := job(stores, job_id)).state != "queued" and row, timeout=60
        )
        assert started.workdir, started.error
        # A cycle's job runs in the cycle's worktree; the probe records its runs next to it.
        runs_txt = Path(started.workdir).parent / "runs.txt"
        wait_for(lambda: runs_txt.exists() and runs_txt.read_text().split(), timeout=60)

        outage_began = time.monotonic()
        try:
            stop_redis(port)
            ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.headers["content-type"].startswith("application/problem+json")
            assert ready.json()["checks"]["broker"] != "ok"
            # The job ends while Redis is down: its "advance the cycle" doorbell cannot be sent,
            # and whatever Redis held (queued and unacked messages) is dropped with it.
            wait_for(lambda: finished(stores, job_id), timeout=60)
            # Hold the outage until the GPU worker has given up ringing that doorbell, so the
            # lost-doorbell path is what this test exercises, not a lucky retry.
            wait_for(
                lambda: "advance doorbell not sent" in workers.logs(), timeout=60, interval=0.2
            )
        finally:
            start_redis(port, folder)  # always: stopped by its fixture
        down_s = time.monotonic() - outage_began
        restarted = time.monotonic()

        done = wait_for(
            lambda: (c := cycle())["state"] in ("awaiting_review", "failed") and c, timeout=120
        )
        recovered_s = time.monotonic() - restarted
        assert done["state"] == "awaiting_review", (done, workers.logs()[-4000:])
        assert client.get("/readyz").status_code == 200

    row = finished(stores, job_id)
    assert row is not None and row.state == "succeeded" and row.attempts == 1
    assert len(runs_txt.read_text().split()) == 1
    figures[f"redis_restart[{backend.name}-redis]"] = {
        "faults_injected": 1,
        "cycles": 1,
        "cycles_completed": 1,
        "lost": 0,
        "duplicated": len(runs_txt.read_text().split()) - row.attempts,
        "job_attempts": row.attempts,
        "redis_down_s": round(down_s, 1),
        "restart_to_awaiting_review_s": round(recovered_s, 1),
        "doorbell_stale_s": settings.doorbell_stale_s,
        "reaper_interval_s": settings.reaper_interval_s,
    }
