"""The GPU queue page shows a job's venv build while a host prepares it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.db import Stores
from app.jobs import preparation
from app.jobs.models import Job
from app.projects import service as ops
from tests.integration.dashboard.conftest import CycleFactory, login


def test_a_job_whose_venv_builds_shows_its_progress(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    cycles.project()
    with stores.ops_session() as session:
        project = ops.get_project(session, "probe-dash")
        job = Job(project_id=project.id, experiment="probe", queue="gpu.cpu", state="queued")
        session.add(job)
        session.flush()
        job_id = job.id
        assert preparation.claim_preparation(session, job_id, "host-a") is not None
    login(client, tokens["reader"])
    assert "building venv" not in client.get("/dashboard/queue").text  # claimed, not building
    with stores.ops_session() as session:
        preparation.record_venv_progress(
            session,
            job_id,
            "host-a",
            {"state": "building", "step": "install", "packages": 37, "elapsed_s": 12.4},
        )
    assert "building venv: 37 packages, 12 s" in client.get("/dashboard/queue").text
    with stores.ops_session() as session:  # ready: its record replaces the progress
        preparation.preparation_ready(
            session,
            job_id,
            "host-a",
            workdir="/a/src",
            venv_path="/a/venv",
            environment={"installer": "uv", "lock": ["six==1.17.0"]},
        )
    assert "building venv" not in client.get("/dashboard/queue").text
