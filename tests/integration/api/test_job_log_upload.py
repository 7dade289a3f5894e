"""A job's log over the API: a GPU host's worker token uploads the whole log (stored whole or not
at all), readers get it back, or the DB's tail while there is no upload; a live follow switches
from the tail to the uploaded file without repeating or losing lines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api.main import create_app
from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import bearer, served

LOG = b"[log] step 1\n[log] step 2 \xe2\x9c\x93\nno newline at the end"


@pytest.fixture
def project_id(stores: Stores, tmp_path: Path) -> int:
    repo = make_repo(tmp_path / "repos", "probe-logs")
    with stores.ops_session() as session:
        return ops.create_project(session, ProjectCreate(name="probe-logs", repo_url=str(repo))).id


def make_job(stores: Stores, project_id: int, state: str, log_tail: str | None = None) -> int:
    with stores.ops_session() as session:
        job = Job(
            project_id=project_id,
            experiment="probe",
            queue="gpu.cpu",
            state=state,
            worker="gpu-cpu-0@elsewhere",
            log_tail=log_tail,
        )
        session.add(job)
        session.flush()
        return job.id


def set_job(stores: Stores, job_id: int, **values: object) -> None:
    with stores.ops_session() as session:
        job = jobs.get(session, job_id)
        for key, value in values.items():
            setattr(job, key, value)


def put_log(
    client: TestClient, job_id: int, token: str | None, body: bytes = LOG
) -> httpx.Response:
    headers = {"Content-Type": "application/octet-stream", **(bearer(token) if token else {})}
    return client.put(f"/api/v1/jobs/{job_id}/log", content=body, headers=headers)


def leftovers(settings: Settings, job_id: int) -> list[str]:
    folder = paths.job_dir(settings, job_id)
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_worker_uploads_the_whole_log_and_readers_get_it_back(
    client: TestClient, tokens: dict[str, str], project_id: int, stores: Stores, settings: Settings
) -> None:
    job_id = make_job(stores, project_id, "succeeded", log_tail="[log] only the tail\n")
    stored = put_log(client, job_id, tokens["worker"])
    assert stored.status_code == 200, stored.text
    assert stored.json() == {"job_id": job_id, "bytes": len(LOG)}
    target = paths.log_path(settings, job_id)
    assert target.read_bytes() == LOG
    assert leftovers(settings, job_id) == ["job.log"]  # no temp file left behind
    with stores.ops_session() as session:
        assert jobs.get(session, job_id).log_path == str(target)

    got = client.get(f"/api/v1/jobs/{job_id}/log", headers=bearer(tokens["review"]))
    assert got.status_code == 200 and got.content == LOG  # the whole log, not the DB's tail

    again = put_log(client, job_id, tokens["admin"], b"[log] a retry's whole log\n")
    assert again.status_code == 200  # admin holds every scope; a later upload replaces
    assert target.read_bytes() == b"[log] a retry's whole log\n"
    text = put_log(client, job_id, tokens["worker"], b"plain\n")
    assert text.status_code == 200


def test_upload_from_the_log_file_itself(
    client: TestClient, tokens: dict[str, str], project_id: int, stores: Stores, settings: Settings
) -> None:
    """A one-machine install: the worker's log is the very file the upload replaces."""
    job_id = make_job(stores, project_id, "running")
    target = paths.log_path(settings, job_id)
    target.parent.mkdir(parents=True)
    target.write_bytes(LOG * 100)
    with open(target, "rb") as source:
        response = client.put(
            f"/api/v1/jobs/{job_id}/log",
            content=source.read(),
            headers={"Content-Type": "text/plain; charset=utf-8", **bearer(tokens["worker"])},
        )
    assert response.status_code == 200, response.text
    assert target.read_bytes() == LOG * 100


@pytest.mark.parametrize(
    ("who", "status", "slug"),
    [
        (None, 401, "unauthorized"),
        ("trigger", 403, "forbidden"),
        ("review", 403, "forbidden"),
        ("revoked", 401, "unauthorized"),
    ],
)
def test_only_a_worker_token_uploads(
    client: TestClient,
    tokens: dict[str, str],
    project_id: int,
    stores: Stores,
    settings: Settings,
    who: str | None,
    status: int,
    slug: str,
) -> None:
    job_id = make_job(stores, project_id, "running")
    response = put_log(client, job_id, tokens[who] if who else None)
    assert response.status_code == status, response.text
    assert response.json()["type"].endswith(f"/{slug}")
    assert leftovers(settings, job_id) == []


def test_a_worker_token_still_reads_nothing(
    client: TestClient, tokens: dict[str, str], project_id: int, stores: Stores
) -> None:
    job_id = make_job(stores, project_id, "running", log_tail="secret-ish\n")
    got = client.get(f"/api/v1/jobs/{job_id}/log", headers=bearer(tokens["worker"]))
    assert got.status_code == 403


def test_unknown_queued_and_wrong_type_are_refused(
    client: TestClient, tokens: dict[str, str], project_id: int, stores: Stores, settings: Settings
) -> None:
    worker = tokens["worker"]
    missing = put_log(client, 999_999, worker)
    assert missing.status_code == 404 and missing.json()["type"].endswith("/job-not-found")
    queued = make_job(stores, project_id, "queued")
    refused = put_log(client, queued, worker)
    assert refused.status_code == 409 and "is queued" in refused.json()["detail"]
    running = make_job(stores, project_id, "running")
    form = client.put(
        f"/api/v1/jobs/{running}/log",
        content=b'{"log": "x"}',
        headers={"Content-Type": "application/json", **bearer(worker)},
    )
    assert form.status_code == 415, form.text
    assert leftovers(settings, queued) == [] and leftovers(settings, running) == []


@pytest.fixture
def small_client(settings: Settings, stores: Stores) -> Iterator[TestClient]:
    """Other requests capped at 1 KiB, a job's log at 4 KiB: the log route has its own limit."""
    tight = settings.model_copy(update={"max_request_bytes": 1024, "max_job_log_bytes": 4096})
    with TestClient(create_app(tight, stores)) as client:
        yield client


def test_a_log_over_its_own_limit_is_413_and_the_old_copy_stays(
    small_client: TestClient,
    tokens: dict[str, str],
    project_id: int,
    stores: Stores,
    settings: Settings,
) -> None:
    job_id = make_job(stores, project_id, "failed")
    first = put_log(small_client, job_id, tokens["worker"], b"x" * 3000 + b"\n")
    assert first.status_code == 200, first.text  # over the general limit, under the log's
    target = paths.log_path(settings, job_id)

    declared = put_log(small_client, job_id, tokens["worker"], b"y" * 5000)
    assert declared.status_code == 413, declared.text
    assert declared.json()["type"].endswith("/too-large")

    def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(10):
            yield b"z" * 1000

    chunked = small_client.put(
        f"/api/v1/jobs/{job_id}/log",
        content=chunks(),
        headers={"Content-Type": "application/octet-stream", **bearer(tokens["worker"])},
    )
    assert chunked.status_code == 413, chunked.text
    assert target.read_bytes() == b"x" * 3000 + b"\n"  # never half of a refused upload
    assert leftovers(settings, job_id) == ["job.log"]

    other = small_client.post(
        "/api/v1/jobs", content=b"{}" + b" " * 2000, headers=bearer(tokens["trigger"])
    )
    assert other.status_code == 413  # the general limit still holds elsewhere


def test_reading_falls_back_to_the_dbs_tail(
    client: TestClient, tokens: dict[str, str], project_id: int, stores: Stores
) -> None:
    reader = bearer(tokens["review"])
    job_id = make_job(stores, project_id, "running", log_tail="[log] epoch 3\n[log] epoch 4\n")
    got = client.get(f"/api/v1/jobs/{job_id}/log", headers=reader)
    assert got.status_code == 200 and got.text == "[log] epoch 3\n[log] epoch 4\n"
    bare = make_job(stores, project_id, "leased")
    assert client.get(f"/api/v1/jobs/{bare}/log", headers=reader).text == ""
    # A path the GPU host recorded on its own disk is not read here: it does not exist here.
    set_job(stores, job_id, log_path="/nonexistent/gpu-host/jobs/1/job.log", state="failed")
    assert client.get(f"/api/v1/jobs/{job_id}/log", headers=reader).text.endswith("epoch 4\n")
    with client.stream(
        "GET", f"/api/v1/jobs/{job_id}/log", params={"follow": 1}, headers=reader
    ) as stream:
        body = "".join(stream.iter_text())
    assert body == "data: [log] epoch 3\n\ndata: [log] epoch 4\n\nevent: end\ndata: failed\n\n"
    missing = client.get("/api/v1/jobs/999999/log", params={"follow": 1}, headers=reader)
    assert missing.status_code == 404


def test_follow_goes_from_the_tail_to_the_upload_over_a_real_server(
    settings: Settings, stores: Stores, tokens: dict[str, str], project_id: int
) -> None:
    job_id = make_job(stores, project_id, "running", log_tail="[log] 1\n[log] 2\n[log] 3 (parti")
    seen: list[str] = []
    with served(create_app(settings, stores)) as base, httpx.Client(base_url=base) as http:
        url = f"/api/v1/jobs/{job_id}/log"
        with http.stream(
            "GET", url, params={"follow": 1}, headers=bearer(tokens["review"]), timeout=30
        ) as stream:
            lines = stream.iter_lines()

            def next_data() -> str:
                while not (line := next(lines)):
                    continue
                seen.append(line)
                return line

            assert [next_data(), next_data()] == ["data: [log] 1", "data: [log] 2"]
            # The worker's tail slides: its start is gone, a whole line has come.
            set_job(stores, job_id, log_tail="[log] 2\n[log] 3 (partial)\n[log] 4\n")
            assert [next_data(), next_data()] == ["data: [log] 3 (partial)", "data: [log] 4"]
            upload = http.put(
                url,
                content=b"[log] 1\n[log] 2\n[log] 3 (partial)\n[log] 4\n[log] 5\ndone",
                headers={"Content-Type": "text/plain", **bearer(tokens["worker"])},
            )
            assert upload.status_code == 200, upload.text
            set_job(stores, job_id, state="succeeded")
            rest = [next_data() for _ in range(4)]
    assert rest == ["data: [log] 5", "data: done", "event: end", "data: succeeded"], seen
