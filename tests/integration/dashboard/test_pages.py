"""Cycles, the GPU queue, research memory and the static assets, over HTML."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from app.cycles.models import CycleStep
from app.db import Stores
from app.jobs.models import Job, Worker
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.projects import service as ops
from tests.integration.dashboard.conftest import CycleFactory, login


def test_cycles_list_shows_state_step_timings_and_cost(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    made = cycles.make(state="running")
    start = datetime.now(UTC) - timedelta(seconds=10)
    with stores.ops_session() as session:
        session.add_all(
            [
                CycleStep(
                    cycle_id=made.cycle_id,
                    name="planned",
                    status="done",
                    started_at=start,
                    finished_at=start + timedelta(milliseconds=250),
                ),
                CycleStep(
                    cycle_id=made.cycle_id,
                    name="preparing",
                    status="done",
                    started_at=start + timedelta(seconds=1),
                    finished_at=start + timedelta(seconds=3.5),
                    detail="venv <reused>",
                ),
            ]
        )
    login(client, tokens["reader"])
    page = client.get("/dashboard/cycles").text
    assert f'href="/dashboard/cycles/{made.cycle_id}"' in page
    assert "planned 250 ms" in page and "preparing 2.5 s" in page
    assert "1.5 GPU-s" in page and 'class="badge s-running"' in page
    # live: a stream to follow with JavaScript, a periodic refresh without it
    assert 'data-live-url="/dashboard/live/cycles"' in page and '<meta http-equiv="refresh"' in page
    assert "/dashboard/static/dashboard.js" in page
    detail = client.get(f"/dashboard/cycles/{made.cycle_id}").text
    assert "venv &lt;reused&gt;" in detail and "2.5 s" in detail
    filtered = client.get("/dashboard/cycles", params={"state": "approved"}).text
    assert "No cycles match these filters" in filtered


def test_cycles_empty_state(client: TestClient, tokens: dict[str, str]) -> None:
    login(client, tokens["reader"])
    page = client.get("/dashboard/cycles").text
    assert "No cycles" in page and "POST /api/v1/cycles" in page and "autopilot worker" in page
    assert '<meta http-equiv="refresh"' not in page  # nothing running: no reloading
    assert 'data-live-url="/dashboard/live/cycles"' in page  # a first cycle will appear


def test_gpu_queue_shows_queues_jobs_workers_and_both_budgets(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    login(client, tokens["reader"])
    empty = client.get("/dashboard/queue").text
    assert "No job is queued or running" in empty and "No worker has reported yet" in empty
    cycles.project()
    with stores.ops_session() as session:
        project = ops.get_project(session, "probe-dash")
        project.budget_gpu_hours_per_day, project.budget_concurrent_gpus = 2.0, 1
        session.add_all(
            [
                Job(
                    project_id=project.id,
                    experiment="probe",
                    queue="gpu.cpu",
                    state="queued",
                    wait_reason="peak budget: project probe-dash uses 1/1 GPUs",
                ),
                Job(
                    project_id=project.id,
                    experiment="probe",
                    queue="gpu.cpu",
                    state="running",
                    worker="gpu-0@host",
                    started_at=datetime.now(UTC),
                ),
            ]
        )
        session.flush()
        running = session.query(Job).filter_by(state="running").one()
        session.add(
            Worker(
                name="gpu-0@host", kind="cpu", devices="0", host="host", current_job_id=running.id
            )
        )
    page = client.get("/dashboard/queue").text
    assert "gpu.cpu" in page and "gpu.h100" in page
    assert "peak budget: project probe-dash uses 1/1 GPUs" in page
    assert "gpu-0@host" in page and f"job {running.id}" in page
    assert "project probe-dash" in page and "/ 2" in page and "1 / 1" in page
    assert "no limit" in page  # the global scope has none configured
    assert re.search(r'class="num over">\s*1 / 1', page)


def test_memory_search_english_korean_filters_and_unverified_marks(
    client: TestClient, tokens: dict[str, str], stores: Stores
) -> None:
    login(client, tokens["reader"])
    empty = client.get("/dashboard/memory").text
    assert "Research memory is empty" in empty and "autopilot memory import" in empty
    with stores.memory_session() as session:
        english = memory.create(
            session,
            FindingCreate(
                project=None,
                kind="lesson",
                statement="Fusing the epilogue saves a memory pass",
                device_kind="h100",
            ),
            "seed",
        )
        korean = memory.create(
            session,
            FindingCreate(
                project=None,
                kind="lesson",
                statement="메모리 대역폭이 병목이다",
                device_kind="a100",
            ),
            "seed",
        )
        memory.validate(session, korean.id, "alice", reason="checked")
        bound = memory.create(
            session,
            FindingCreate(
                project=None,
                kind="bound",
                statement="<b>tile</b> ≤ 128 on L40S",
                source="https://example.org/paper",
                source_status="verified",
                publication_status="verified",
            ),
            "seed",
        )
    page = client.get("/dashboard/memory", params={"q": "epilogue"}).text
    assert english.id in page and korean.id not in page
    assert "unverified" in page  # no verified source: marked
    ko = client.get("/dashboard/memory", params={"q": "대역폭"}).text
    assert korean.id in ko and english.id not in ko and "메모리 대역폭이 병목이다" in ko
    by_status = client.get("/dashboard/memory", params={"status": "validated"}).text
    assert korean.id in by_status and english.id not in by_status
    by_kind = client.get("/dashboard/memory", params={"kind": "bound"}).text
    assert bound.id in by_kind and "&lt;b&gt;tile&lt;/b&gt;" in by_kind
    by_device = client.get("/dashboard/memory", params={"device": "h100"}).text
    assert english.id in by_device and korean.id not in by_device
    bad = client.get("/dashboard/memory", params={"kind": "rumour"})
    assert bad.status_code == 200 and "kind" in bad.text and 'class="flash bad"' in bad.text
    none = client.get("/dashboard/memory", params={"q": "zzzz-nothing"}).text
    assert "No finding matches" in none


def test_finding_page_shows_evidence_and_audit_trail(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory, stores: Stores
) -> None:
    made = cycles.make()
    with stores.memory_session() as session:
        memory.validate(session, made.finding_ids[0], "alice", reason="looks <right>")
    login(client, tokens["reader"])
    page = client.get(f"/dashboard/memory/{made.finding_ids[0]}").text
    assert f'href="/dashboard/cycles/{made.cycle_id}"' in page
    assert f"results/{made.cycle_id}/result.json" in page and "local://probe-dash/pulls/1" in page
    assert "new → " in page and "proposed → " in page and "alice" in page
    assert "looks &lt;right&gt;" in page
    assert 'class="badge f-validated"' in page
    missing = client.get("/dashboard/memory/" + "0" * 32)
    assert missing.status_code == 404
    # Ids beyond the 32-bit columns name nothing: a 404 page on every back end, not a 500.
    for path in ("/dashboard/cycles/{}", "/dashboard/cycles/{}/plot.svg"):
        assert client.get(path.format(2**63)).status_code == 404


def test_static_assets_are_local_and_pages_load_nothing_from_elsewhere(
    client: TestClient, tokens: dict[str, str], cycles: CycleFactory
) -> None:
    css = client.get("/dashboard/static/dashboard.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "@media" in css.text  # responsive rules
    assert client.get("/dashboard/static/dashboard.js").status_code == 200
    assert client.get("/dashboard/static/../router.py").status_code == 404
    assert client.get("/dashboard/static/missing.css").status_code == 404
    made = cycles.make()
    login(client, tokens["reader"])
    for path in (
        "/dashboard/",
        "/dashboard/cycles",
        "/dashboard/queue",
        "/dashboard/memory",
        f"/dashboard/cycles/{made.cycle_id}",
        "/dashboard/login",
    ):
        response = client.get(path)
        assert response.status_code == 200, path
        assert not re.search(r'(src|href)="(https?:)?//', response.text), path
        assert response.headers["x-frame-options"] == "DENY"
        assert 'name="viewport"' in response.text
