"""The GPU queue page shows a job a busy worker reserved (app/jobs/reservations.py) as such: in
the list with its state, counted apart from the queued jobs."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from app.db import Stores
from app.jobs.models import Job
from app.projects import service as ops
from tests.integration.dashboard.conftest import CycleFactory, login


def test_a_reserved_job_is_listed_and_counted_as_reserved(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    cycles.project()
    with stores.ops_session() as session:
        project = ops.get_project(session, "probe-dash")
        for state in ("queued", "reserved", "reserved"):
            session.add(
                Job(project_id=project.id, experiment="probe", queue="gpu.cpu", state=state)
            )
    login(client, tokens["reader"])
    page = client.get("/dashboard/queue").text
    assert re.search(r'data-label="Queued" class="num">1<', page)
    assert re.search(r'data-label="Reserved" class="num">2<', page)
    assert page.count('<span class="badge s-reserved">reserved</span>') == 2
    assert page.count("its reserver&#39;s current job") == 2
