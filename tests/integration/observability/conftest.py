"""An API client with the metrics router mounted, and small builders of ops rows."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from app.api.main import create_app
from app.db import Stores
from app.jobs.models import Job, Worker
from app.projects.models import Project
from app.settings import Settings

SCRAPE_TOKEN = "scrape-only-secret"


@pytest.fixture
def metrics_client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    """A client that scrapes as Prometheus would, with the metrics token."""
    app = create_app(settings.model_copy(update={"metrics_token": SecretStr(SCRAPE_TOKEN)}), stores)
    with TestClient(app, headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"}) as client:
        yield client


@pytest.fixture
def project_id(stores: Stores) -> int:
    with stores.ops_session() as session:
        project = Project(name="obs", repo_url="/nowhere", gpu_kind="cpu")
        session.add(project)
        session.flush()
        return project.id


@pytest.fixture
def add_job(stores: Stores, project_id: int) -> Callable[..., int]:
    """Insert a job row directly (the queue's own tests cover how jobs get there)."""

    def add(queue: str = "gpu.cpu", state: str = "queued", **fields: Any) -> int:
        with stores.ops_session() as session:
            job = Job(
                project_id=project_id,
                experiment="probe",
                queue=queue,
                state=state,
                order_key=datetime.now(UTC),
                submitted_at=fields.pop("submitted_at", datetime.now(UTC)),
                **fields,
            )
            session.add(job)
            session.flush()
            return job.id

    return add


@pytest.fixture
def add_worker(stores: Stores) -> Callable[..., None]:
    def add(name: str, device: str, current_job_id: int | None, seen_ago_s: float) -> None:
        with stores.ops_session() as session:
            session.add(
                Worker(
                    name=name,
                    kind="cpu",
                    devices=device,
                    host="host-a",
                    last_seen=datetime.now(UTC) - timedelta(seconds=seen_ago_s),
                    current_job_id=current_job_id,
                )
            )

    return add
