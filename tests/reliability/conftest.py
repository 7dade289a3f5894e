"""The fault-injection suite: real workers, real Redis and PostgreSQL, faults injected on purpose.

Every test here is bounded in time (pytest-timeout), waits on conditions with deadlines (never a
bare sleep as synchronisation), and undoes what it did to the machine in a `finally` block.
Each test writes its measured figures to `test-artifacts/reliability.json` (docs/operations.md
quotes them).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import Job, Lease
from app.projects import config as project_config
from app.projects import repository as ops_repository
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings

# The real worker processes and brokers of the queue tests, shared with this suite.
from tests.integration.queue.conftest import (  # noqa: F401 - fixtures
    broker_url,
    queue_settings,
    shared_venv_root,
    workers,
)

ROOT = Path(__file__).resolve().parents[2]
FIGURES = ROOT / "test-artifacts" / "reliability.json"
FINISHED = ("succeeded", "failed", "cancelled")
REQUIRE_SERVICES = os.environ.get("AUTOPILOT_TEST_REQUIRE_SERVICES") == "1"


def pytest_configure(config: pytest.Config) -> None:
    # Registered here rather than in pyproject.toml so this suite is self-contained.
    config.addinivalue_line(
        "markers", "reliability: fault injection and load against real workers and servers"
    )


def skip_or_fail(reason: str) -> None:
    """Outside CI a missing tool skips with the reason; in CI it is an error, never a skip."""
    if REQUIRE_SERVICES:
        pytest.fail(f"CI (AUTOPILOT_TEST_REQUIRE_SERVICES=1) needs it: {reason}")
    pytest.skip(reason)


def need_tools(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        skip_or_fail(f"{', '.join(missing)} not installed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def production_variant_only(backend_name: str) -> None:
    """Heavy tests run once: on PostgreSQL + Redis when they are configured, else embedded."""
    from tests.conftest import POSTGRES_URL, REDIS_URL

    if backend_name == "sqlite" and POSTGRES_URL and REDIS_URL:
        pytest.skip("runs once, on PostgreSQL + Redis (configured here), as in production")


# -- figures ------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def figures() -> Iterator[dict[str, Any]]:
    """What the suite measured, by test; merged into test-artifacts/reliability.json."""
    collected: dict[str, Any] = {}
    yield collected
    if not collected:
        return
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    try:
        merged = json.loads(FIGURES.read_text())
    except (OSError, ValueError):
        merged = {}
    merged.setdefault("tests", {}).update(collected)
    merged["updated_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    merged["host"] = {"cpus": os.cpu_count()}
    FIGURES.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")


# -- jobs -----------------------------------------------------------------------------------------


def ensure_project(stores: Stores, repo: Path, **budget: Any) -> int:
    with stores.ops_session() as session:
        project = ops_repository.get_project(session, repo.name)
        if project is None:
            project = ops.create_project(session, ProjectCreate(name=repo.name, repo_url=str(repo)))
        for key, value in budget.items():
            setattr(project, key, value)
        session.flush()
        return project.id


def submit(stores: Stores, settings: Settings, repo: Path, **params: Any) -> int:
    """A standalone job of the probe experiment, through the service, then its doorbell."""
    ensure_project(stores, repo)
    cfg = project_config.load(repo)
    with stores.ops_session() as session:
        project = ops.get_project(session, repo.name)
        job_id = jobs.submit(session, settings, project, cfg, "probe", dict(params)).id
    broker.ring_gpu(settings, "gpu.cpu")
    return job_id


def job_rows(stores: Stores, ids: list[int]) -> dict[int, Job]:
    with stores.ops_session() as session:
        rows = session.scalars(select(Job).where(Job.id.in_(ids))).all()
        for row in rows:
            session.expunge(row)
    return {row.id: row for row in rows}


def job(stores: Stores, job_id: int) -> Job:
    return job_rows(stores, [job_id])[job_id]


def finished(stores: Stores, job_id: int) -> Job | None:
    row = job(stores, job_id)
    return row if row.state in FINISHED else None


def all_finished(stores: Stores, ids: list[int]) -> dict[int, Job] | None:
    rows = job_rows(stores, ids)
    return rows if all(r.state in FINISHED for r in rows.values()) else None


def leases_of(stores: Stores, ids: list[int]) -> list[Lease]:
    with stores.ops_session() as session:
        return list(session.scalars(select(Lease).where(Lease.job_id.in_(ids))).all())


def runs(settings: Settings, job_id: int) -> list[str]:
    """One line per start of the probe experiment for this job (its pid)."""
    path = settings.state_dir.absolute() / "jobs" / str(job_id) / "runs.txt"
    return path.read_text().split() if path.exists() else []


def tally(settings: Settings, rows: dict[int, Job]) -> dict[str, int]:
    """Completed, lost and duplicated, as docs/operations.md defines them.

    lost: a job that did not end `succeeded`; duplicated: a start of the experiment that no
    lease accounts for (more runs than recorded attempts), or a job still holding a lease.
    """
    counts = {i: len(runs(settings, i)) for i in rows}
    return {
        "jobs": len(rows),
        "completed": sum(r.state == "succeeded" for r in rows.values()),
        "lost": sum(r.state != "succeeded" for r in rows.values()),
        "duplicated": sum(max(0, counts[i] - r.attempts) for i, r in rows.items()),
        "attempts": sum(r.attempts for r in rows.values()),
        "experiment_starts": sum(counts.values()),
    }


def variant(backend_name: str, settings: Settings) -> str:
    """The stores and broker a test ran on, as in the test ids: `postgres-redis`."""
    transport = "redis" if settings.broker_url.startswith("redis") else "filesystem"
    return f"{backend_name}-{transport}"
