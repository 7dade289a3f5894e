"""`autopilot job logs [--follow]` when the job runs on another host: the DB's tail until the
whole log is uploaded to this host, then the file; never a line twice."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.cli.jobs import job_app
from app.cli.local import follow_job
from app.db import Stores
from app.jobs import paths
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from tests.integration.queue.conftest import make_repo
from tests.support import wait_for


@pytest.fixture
def project_id(stores: Stores, tmp_path: Path) -> int:
    repo = make_repo(tmp_path / "repos", "probe-tail")
    with stores.ops_session() as session:
        return ops.create_project(session, ProjectCreate(name="probe-tail", repo_url=str(repo))).id


def make_job(stores: Stores, project_id: int, state: str, log_tail: str | None) -> int:
    with stores.ops_session() as session:
        job = Job(
            project_id=project_id,
            experiment="probe",
            queue="gpu.cpu",
            state=state,
            worker="gpu-cpu-0@elsewhere",
            # the GPU host's own path: it does not exist on this host and is never read
            log_path="/nonexistent/gpu-host/job.log",
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


def env(settings: Settings) -> dict[str, str]:
    return {
        "AUTOPILOT_STATE_DIR": str(settings.state_dir),
        "AUTOPILOT_OPS_URL": settings.ops_database_url,
        "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
    }


def test_logs_print_the_tail_when_no_log_was_uploaded(
    settings: Settings, stores: Stores, project_id: int
) -> None:
    job_id = make_job(stores, project_id, "failed", "[log] epoch 9\n[log] out of memory")
    shown = CliRunner().invoke(job_app, ["logs", str(job_id)], env=env(settings))
    assert shown.exit_code == 0, shown.output
    assert shown.stdout == "[log] epoch 9\n[log] out of memory\n"
    followed = CliRunner().invoke(job_app, ["logs", str(job_id), "-f"], env=env(settings))
    assert followed.exit_code == 1  # it failed
    assert followed.stdout == "[log] epoch 9\n[log] out of memory\n"
    nothing = make_job(stores, project_id, "leased", None)
    assert CliRunner().invoke(job_app, ["logs", str(nothing)], env=env(settings)).stdout == ""

    paths.log_path(settings, job_id).parent.mkdir(parents=True)
    paths.log_path(settings, job_id).write_text("[log] epoch 1\n[log] epoch 9\n[log] out of memory")
    whole = CliRunner().invoke(job_app, ["logs", str(job_id)], env=env(settings))
    assert whole.stdout == "[log] epoch 1\n[log] epoch 9\n[log] out of memory\n"  # the upload


def test_follow_reads_the_tail_then_the_upload(
    settings: Settings, stores: Stores, project_id: int
) -> None:
    job_id = make_job(stores, project_id, "running", "[log] a\n[log] b\n[log] c (half")
    out: list[str] = []
    status: list[str] = []
    result: list[str] = []
    thread = threading.Thread(
        target=lambda: result.append(
            follow_job(stores, settings, job_id, poll_s=0.02, out=out.append, status=status.append)
        ),
        daemon=True,
    )
    thread.start()
    wait_for(lambda: "".join(out) == "[log] a\n[log] b\n", timeout=20)
    set_job(stores, job_id, log_tail="[log] b\n[log] c (half done)\n[log] d\n")
    wait_for(lambda: "".join(out).endswith("[log] d\n"), timeout=20)
    log = paths.log_path(settings, job_id)
    log.parent.mkdir(parents=True)
    log.write_text("[log] a\n[log] b\n[log] c (half done)\n[log] d\n[log] e\nthe end")
    set_job(stores, job_id, state="succeeded")
    thread.join(timeout=20)
    assert result == ["succeeded"]
    assert "".join(out) == "[log] a\n[log] b\n[log] c (half done)\n[log] d\n[log] e\nthe end\n"
    assert status[0].endswith("running on gpu-cpu-0@elsewhere (attempt 0)")
