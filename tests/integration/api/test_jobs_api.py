"""The GPU queue over REST: submit (a doorbell rung after the commit), list, get, cancel, logs,
workers, queues; bad input as problem+json with nothing stored and nothing enqueued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.jobs import lifecycle
from app.jobs import service as jobs
from app.jobs.lifecycle import JobState
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import bearer


@pytest.fixture
def probe(stores: Stores, tmp_path: Path) -> str:
    repo = make_repo(tmp_path / "repos", "probe-api")
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="probe-api", repo_url=str(repo)))
    return "probe-api"


def doorbells(settings: Settings, queue: str) -> list[Path]:
    """The messages waiting in the filesystem broker's folder for `queue`."""
    return sorted((settings.broker_dir / "queue").glob(f"*.{queue}.msg"))


def job_count(stores: Stores) -> int:
    with stores.ops_session() as session:
        return len(jobs.list_jobs(session))


def submit(client: TestClient, token: str, **body: Any) -> Any:
    response = client.post(
        "/api/v1/jobs",
        json={"project": "probe-api", "experiment": "probe", **body},
        headers=bearer(token),
    )
    assert response.status_code == 201, response.text
    return response.json()


def test_submit_get_list_cancel(
    client: TestClient, tokens: dict[str, str], probe: str, stores: Stores, settings: Settings
) -> None:
    trigger, reader = tokens["trigger"], bearer(tokens["review"])
    job = submit(client, trigger, parameters={"sleep_s": 0.5})
    assert (job["state"], job["queue"], job["attempts"]) == ("queued", "gpu.cpu", 0)
    assert job["parameters"] == {"sleep_s": 0.5, "grandchild": 0}  # defaults filled in
    # the doorbell of its GPU queue (its workers prepare it on their hosts), after the commit
    assert len(doorbells(settings, "gpu.cpu")) == 1
    other = submit(client, trigger, queue="gpu.h100")
    assert other["queue"] == "gpu.h100"

    got = client.get(f"/api/v1/jobs/{job['id']}", headers=reader)
    assert got.status_code == 200 and got.json()["parameters"]["sleep_s"] == 0.5
    listed = client.get("/api/v1/jobs", headers=reader).json()
    assert [j["id"] for j in listed] == [other["id"], job["id"]]  # newest first
    by_queue = client.get("/api/v1/jobs", params={"queue": "gpu.h100"}, headers=reader).json()
    assert [j["id"] for j in by_queue] == [other["id"]]
    by_project = client.get("/api/v1/jobs", params={"project": probe}, headers=reader).json()
    assert len(by_project) == 2

    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(trigger))
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["state"], cancelled.json()["cancelled_by"]) == (
        "cancelled",
        "t-trigger",
    )
    by_state = client.get("/api/v1/jobs", params={"state": "cancelled"}, headers=reader).json()
    assert [j["id"] for j in by_state] == [job["id"]]
    queued = client.get("/api/v1/jobs", params={"state": "queued"}, headers=reader).json()
    assert [j["id"] for j in queued] == [other["id"]]

    again = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=bearer(trigger))
    assert again.status_code == 409
    assert again.headers["content-type"] == "application/problem+json"
    assert again.json()["type"].endswith("/job-finished")
    missing = client.get("/api/v1/jobs/999", headers=reader)
    assert missing.status_code == 404 and missing.json()["type"].endswith("/job-not-found")


@pytest.fixture
def strict_client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    """A client whose per-job time limit is below the probe's declared 120 s."""
    tight = settings.model_copy(update={"max_job_time_limit_s": 60.0})
    with TestClient(create_app(tight, stores)) as client:
        yield client


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"queue": "gpu.tpu"}, 422, "unknown queue 'gpu.tpu'"),
        ({"experiment": "train"}, 422, "experiment 'train' is not declared"),
        ({"parameters": {"sleep_s": 7}}, 422, "sleep_s=7 is outside the declared space"),
        ({"parameters": {"lr": 0.1}}, 422, "parameter 'lr' is not declared"),
        ({"project": "nope"}, 404, "no project named 'nope'"),
        ({"time_limit": "long"}, 422, "time_limit"),
        ({"parameters": {"sleep_s": [1, 2]}}, 422, "parameters"),
        ({}, 422, "above the per-job limit 60"),
    ],
)
def test_bad_submissions_store_and_enqueue_nothing(
    strict_client: TestClient,
    tokens: dict[str, str],
    probe: str,
    stores: Stores,
    settings: Settings,
    body: dict[str, Any],
    status: int,
    needle: str,
) -> None:
    full = {"project": probe, "experiment": "probe", **body}
    response = strict_client.post("/api/v1/jobs", json=full, headers=bearer(tokens["trigger"]))
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert needle in response.text
    assert job_count(stores) == 0
    assert doorbells(settings, "gpu.cpu") == []


def test_bad_list_filters_are_4xx(client: TestClient, tokens: dict[str, str]) -> None:
    headers = bearer(tokens["review"])
    for params, status in (
        ({"state": "done"}, 422),
        ({"queue": "gpu.tpu"}, 422),
        ({"project": "nope"}, 404),
        ({"limit": 0}, 422),
    ):
        response = client.get("/api/v1/jobs", params=params, headers=headers)
        assert response.status_code == status, (params, response.text)
        assert response.headers["content-type"] == "application/problem+json"


def test_workers_and_queues(
    client: TestClient, tokens: dict[str, str], probe: str, stores: Stores
) -> None:
    headers = bearer(tokens["review"])
    assert client.get("/api/v1/workers", headers=headers).json() == []
    with stores.ops_session() as session:
        jobs.register_worker(session, "gpu-cpu-0@host", "cpu", "0", host="host")
    (worker,) = client.get("/api/v1/workers", headers=headers).json()
    assert (worker["name"], worker["kind"], worker["host"], worker["current_job_id"]) == (
        "gpu-cpu-0@host",
        "cpu",
        "host",
        None,
    )

    first = submit(client, tokens["trigger"])
    submit(client, tokens["trigger"])
    queues = {q["queue"]: q for q in client.get("/api/v1/queues", headers=headers).json()}
    assert (queues["gpu.cpu"]["queued"], queues["gpu.cpu"]["running"]) == (2, 0)
    assert queues["gpu.cpu"]["oldest_queued_at"][:19] == first["submitted_at"][:19]
    assert queues["gpu.h100"]["queued"] == 0 and queues["gpu.h100"]["oldest_queued_at"] is None


def test_log_tail_and_follow(
    client: TestClient, tokens: dict[str, str], probe: str, stores: Stores, settings: Settings
) -> None:
    headers = bearer(tokens["review"])
    job = submit(client, tokens["trigger"])
    log = settings.state_dir.absolute() / "jobs" / str(job["id"]) / "job.log"
    assert client.get(f"/api/v1/jobs/{job['id']}/log", headers=headers).text == ""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[log] step 1\n[log] step 2\n")
    tail = client.get(f"/api/v1/jobs/{job['id']}/log", headers=headers)
    assert tail.status_code == 200 and tail.text == "[log] step 1\n[log] step 2\n"

    with stores.ops_session() as session:
        jobs.cancel(session, job["id"], by="test")
    with client.stream(
        "GET", f"/api/v1/jobs/{job['id']}/log", params={"follow": 1}, headers=headers
    ) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        body = "".join(stream.iter_text())
    assert body == "data: [log] step 1\n\ndata: [log] step 2\n\nevent: end\ndata: cancelled\n\n"
    assert client.get("/api/v1/jobs/999/log", headers=headers).status_code == 404


def test_standalone_jobs_have_the_same_cap_as_cycles(
    settings: Settings, stores: Stores, tokens: dict[str, str], probe: str
) -> None:
    """Issue 20, item 4: a flood of POST /api/v1/jobs is refused (429) at the per-project cap of
    unfinished cycles, with nothing stored; a finished job frees its place."""
    capped = settings.model_copy(update={"max_live_cycles_per_project": 2})
    with TestClient(create_app(capped, stores)) as client:
        first = submit(client, tokens["trigger"])
        submit(client, tokens["trigger"])
        refused = client.post(
            "/api/v1/jobs",
            json={"project": probe, "experiment": "probe", "parameters": {}},
            headers=bearer(tokens["trigger"]),
        )
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"].endswith("too-many-jobs")
        assert "AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT" in refused.json()["detail"]
        assert job_count(stores) == 2
        cancelled = client.post(
            f"/api/v1/jobs/{first['id']}/cancel", headers=bearer(tokens["trigger"])
        )
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        assert submit(client, tokens["trigger"])["state"] == "queued"


def test_reserved_jobs_are_filtered_and_counted_apart(
    client: TestClient, tokens: dict[str, str], probe: str, stores: Stores
) -> None:
    """A job a busy worker reserved (app/jobs/reservations.py) has its own state: the list's
    filter takes it, and the queue counts it apart from the queued ones, still waiting."""
    headers = bearer(tokens["review"])
    first, second = submit(client, tokens["trigger"]), submit(client, tokens["trigger"])
    with stores.ops_session() as session:
        lifecycle.move(jobs.get(session, second["id"]), JobState.RESERVED)
    listed = client.get("/api/v1/jobs", params={"state": "reserved"}, headers=headers).json()
    assert [j["id"] for j in listed] == [second["id"]]
    queued = client.get("/api/v1/jobs", params={"state": "queued"}, headers=headers).json()
    assert [j["id"] for j in queued] == [first["id"]]
    queues = {q["queue"]: q for q in client.get("/api/v1/queues", headers=headers).json()}
    assert (queues["gpu.cpu"]["queued"], queues["gpu.cpu"]["reserved"]) == (1, 1)
    assert queues["gpu.h100"]["reserved"] == 0
