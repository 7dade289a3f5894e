"""The GPU host's client of the control API against the real app served by uvicorn on loopback:
the log arrives whole, and a failed upload says why without ever showing the token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from app.api.main import create_app
from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import free_port, served
from workers import control_client


@pytest.fixture
def control(settings: Settings, stores: Stores) -> Iterator[str]:
    with served(create_app(settings, stores)) as base:
        yield base


@pytest.fixture
def job_id(stores: Stores, tmp_path: Path) -> int:
    repo = make_repo(tmp_path / "repos", "probe-upload")
    with stores.ops_session() as session:
        project = ops.create_project(
            session, ProjectCreate(name="probe-upload", repo_url=str(repo))
        )
        job = Job(project_id=project.id, experiment="probe", queue="gpu.cpu", state="running")
        session.add(job)
        session.flush()
        return job.id


def token(stores: Stores, scope: str) -> str:
    with stores.ops_session() as session:
        return ops.create_token(session, f"gpu-host-{scope}", [scope])[1]


def gpu_host(settings: Settings, tmp_path: Path, url: str, secret: str | None) -> Settings:
    """A GPU host's settings: its own state dir, the control URL and token, nothing else."""
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        state_dir=tmp_path / "gpu-host",
        control_url=url,
        control_token=SecretStr(secret) if secret else None,
    )


def test_upload_log_arrives_whole(
    control: str, settings: Settings, stores: Stores, job_id: int, tmp_path: Path
) -> None:
    host = gpu_host(settings, tmp_path, control, token(stores, "worker"))
    log = paths.log_path(host, job_id)  # on the GPU host's disk, not the control host's
    log.parent.mkdir(parents=True)
    body = b"".join(f"[log] line {n} \xe2\x9c\x93\n".encode("latin-1") for n in range(50_000))
    log.write_bytes(body)
    control_client.upload_log(host, job_id, log)
    stored = paths.log_path(settings, job_id)
    assert stored != log and stored.read_bytes() == body
    with stores.ops_session() as session:
        assert jobs.get(session, job_id).log_path == str(stored)


@pytest.mark.parametrize("scope", ["trigger", "revoked"])
def test_refused_upload_names_the_reason_not_the_token(
    control: str, settings: Settings, stores: Stores, job_id: int, tmp_path: Path, scope: str
) -> None:
    secret = token(stores, "trigger" if scope == "trigger" else "worker")
    if scope == "revoked":
        with stores.ops_session() as session:
            ops.revoke_token(session, "gpu-host-worker")
    host = gpu_host(settings, tmp_path, control, secret)
    log = tmp_path / "job.log"
    log.write_text("[log] x\n")
    with pytest.raises(control_client.LogUploadFailed) as failed:
        control_client.upload_log(host, job_id, log)
    message = str(failed.value)
    assert secret not in message and secret not in repr(failed.value)
    expected = "HTTP 403" if scope == "trigger" else "HTTP 401"
    assert expected in message and f"job {job_id}'s log" in message, message
    assert not paths.log_path(settings, job_id).exists()


def test_unknown_job_unreachable_host_missing_file_and_no_token(
    control: str, settings: Settings, stores: Stores, job_id: int, tmp_path: Path
) -> None:
    secret = token(stores, "worker")
    log = tmp_path / "job.log"
    log.write_text("[log] x\n")
    cases = [
        (gpu_host(settings, tmp_path, control, secret), 999_999, log, "HTTP 404: no job 999999"),
        (
            gpu_host(settings, tmp_path, f"http://127.0.0.1:{free_port()}", secret),
            job_id,
            log,
            "ConnectError",
        ),
        (gpu_host(settings, tmp_path, control, secret), job_id, tmp_path / "gone.log", "gone.log"),
        (gpu_host(settings, tmp_path, control, None), job_id, log, "AUTOPILOT_CONTROL_TOKEN"),
    ]
    for host, target, path, needle in cases:
        with pytest.raises(control_client.LogUploadFailed) as failed:
            control_client.upload_log(host, target, path, timeout=httpx.Timeout(10.0))
        assert needle in str(failed.value), str(failed.value)
        assert secret not in str(failed.value)
