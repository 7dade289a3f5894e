"""Stop PostgreSQL under the API: 503 problem+json everywhere, never 500; after a restart, on.

The machine's PostgreSQL cluster is shared with other tests and slow to restart, so this test
starts a private instance of the same binaries (initdb into a temporary dir, its own socket dir
and a free port), points both stores at it, and stops and starts that one.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from app import migrate
from app.api.main import create_app
from app.db import Stores
from app.projects import service as ops
from app.settings import Settings
from tests.reliability.conftest import free_port
from tests.support import bearer, wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(180),
]

PROBLEM_JSON = "application/problem+json"


@dataclass
class PrivatePostgres:
    bindir: Path
    base: Path
    port: int
    as_owner: list[str]

    @property
    def data(self) -> Path:
        return self.base / "data"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def pg_ctl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.as_owner, str(self.bindir / "pg_ctl"), "-D", str(self.data), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c full_page_writes=off"
        )
        done = self.pg_ctl("-l", str(self.base / "server.log"), "-o", options, "-w", "start")
        assert done.returncode == 0, done.stdout + done.stderr + self.log()

    def stop(self, mode: str = "fast") -> None:
        done = self.pg_ctl("-m", mode, "-w", "stop")
        assert done.returncode == 0, done.stdout + done.stderr

    def running(self) -> bool:
        return self.pg_ctl("status", timeout=10).returncode == 0

    def log(self) -> str:
        path = self.base / "server.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


def _postgres_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    as_owner: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="ap-pg-"))
    if os.geteuid() == 0:  # initdb refuses root: the instance belongs to the postgres user
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser: cannot start PostgreSQL as postgres")
        try:
            shutil.chown(base, "postgres", "postgres")
        except (LookupError, PermissionError) as exc:
            pytest.skip(f"no postgres user to own a private instance: {exc}")
        as_owner = ["runuser", "-u", "postgres", "--"]
    instance = PrivatePostgres(bindir, base, free_port(), as_owner)
    try:
        done = subprocess.run(
            [
                *as_owner,
                str(bindir / "initdb"),
                "-D",
                str(instance.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        instance.start()
        yield instance
    finally:
        if instance.data.exists() and instance.running():
            instance.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


def _api_get_routes(client: TestClient) -> list[str]:
    """Every GET route of the REST API, from the OpenAPI document; path parameters set to 1."""
    paths = client.get("/openapi.json").json()["paths"]
    return sorted(
        re.sub(r"\{[^}]+\}", "1", p)
        for p, ops_ in paths.items()
        if "get" in ops_ and p.startswith("/api/")
    )


def test_postgres_down_gives_503_problem_json_then_recovers(
    private_postgres: PrivatePostgres, tmp_path: Path, figures: dict[str, Any]
) -> None:
    pg = private_postgres
    admin = create_engine(pg.url("postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        for name in ("ap_memory", "ap_ops"):
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "state",
        memory_url=pg.url("ap_memory"),
        ops_url=pg.url("ap_ops"),
        broker_url="filesystem://",  # the broker stays up: only the stores fail
    )
    migrate.upgrade(settings)
    stores = Stores.from_settings(settings)
    with stores.ops_session() as session:
        _, token = ops.create_token(session, "ops-admin", ["admin"])
    auth = bearer(token)
    try:
        with TestClient(create_app(settings, stores), raise_server_exceptions=False) as client:
            assert client.get("/readyz").status_code == 200
            assert client.get("/api/v1/projects", headers=auth).status_code == 200
            routes = _api_get_routes(client)
            assert "/api/v1/projects" in routes

            pg.stop("fast")
            stopped = time.monotonic()
            ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.headers["content-type"].startswith(PROBLEM_JSON)
            problem = ready.json()
            assert problem["status"] == 503 and problem["type"].endswith("/not-ready")
            assert problem["checks"]["ops"] != "ok" and problem["checks"]["memory"] != "ok"
            assert problem["checks"]["broker"] == "ok"
            assert "ops (" in problem["detail"] and "memory (" in problem["detail"]

            # Every authenticated call is a 503 too (its token may be answered from the token
            # cache; the route's own store access is not).
            answers: dict[str, int] = {}
            for path in routes:
                response = client.get(path, headers=auth)
                answers[path] = response.status_code
                assert response.status_code == 503, (path, response.status_code, response.text)
                assert response.headers["content-type"].startswith(PROBLEM_JSON), path
                body = response.json()
                assert body["type"].endswith("/store-unavailable"), (path, body)
                assert response.headers.get("retry-after") == "5", path
            created = client.post(
                "/api/v1/projects", headers=auth, json={"name": "after-outage", "repo_url": "/x"}
            )
            answers["POST /api/v1/projects"] = created.status_code
            assert created.status_code == 503, created.text
            metrics = client.get("/metrics", headers=auth)  # it must not turn into a 500 either
            answers["GET /metrics"] = metrics.status_code
            assert metrics.status_code in (200, 503), metrics.text[:500]
            no_token = client.get("/api/v1/projects")  # 401 needs no DB: it is still a 401
            assert no_token.status_code == 401
            outage_s = time.monotonic() - stopped

            pg.start()
            restarted = time.monotonic()
            wait_for(lambda: client.get("/readyz").status_code == 200, timeout=60, interval=0.2)
            recovered_s = time.monotonic() - restarted
            listed = client.get("/api/v1/projects", headers=auth)
            assert listed.status_code == 200, listed.text
            repo = tmp_path / "repo"
            repo.mkdir()
            created = client.post(
                "/api/v1/projects",
                headers=auth,
                json={"name": "after-outage", "repo_url": str(repo)},
            )
            assert created.status_code == 201, created.text
            names = [p["name"] for p in client.get("/api/v1/projects", headers=auth).json()]
            assert names == ["after-outage"]
            for path in routes:
                assert client.get(path, headers=auth).status_code < 500, path
    finally:
        stores.dispose()
    figures["postgres_outage[private-postgres]"] = {
        "faults_injected": 1,
        "requests_during_outage": len(answers) + 2,  # + /readyz and the unauthenticated call
        "answered_503": sum(code == 503 for code in answers.values()) + 1,
        "metrics_status_during_outage": answers["GET /metrics"],
        "answered_500": sum(code == 500 for code in answers.values()),
        "routes_probed": len(routes),
        "outage_s": round(outage_s, 1),
        "restart_to_ready_s": round(recovered_s, 2),
    }
