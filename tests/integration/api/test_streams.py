"""Server-sent-event streams (issue 20, item 3) against a real `autopilot serve`: an open stream
does not hold the server up when it is asked to stop, and a token may hold only so many."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import httpx

from app.db import Stores
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.models import Project
from app.settings import Settings
from tests.support import bearer, free_port, port_open, wait_for


def queued_job(stores: Stores) -> int:
    """A job that never ends here: its log stream stays open until something closes it."""
    with stores.ops_session() as session:
        project = Project(name="streamed", repo_url="/nowhere", gpu_kind="cpu")
        session.add(project)
        session.flush()
        job = Job(
            project_id=project.id,
            experiment="probe",
            queue="gpu.cpu",
            state="queued",
            order_key=datetime.now(UTC),
            submitted_at=datetime.now(UTC),
        )
        session.add(job)
        session.flush()
        return job.id


def serve(settings: Settings, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env.update(
        {
            "AUTOPILOT_STATE_DIR": str(settings.state_dir),
            "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
            "AUTOPILOT_OPS_URL": settings.ops_database_url,
            "AUTOPILOT_MAX_STREAMS_PER_TOKEN": "2",
        }
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_open_streams_end_when_the_server_stops_and_are_capped_per_token(
    settings: Settings, stores: Stores, tmp_path: Path
) -> None:
    job_id = queued_job(stores)
    with stores.ops_session() as session:
        _, token = ops.create_token(session, "follower", ["review"])
        _, other = ops.create_token(session, "other", ["review"])
    port = free_port()
    proc = serve(settings, port, tmp_path / "serve.log")
    try:
        wait_for(lambda: port_open(port), timeout=60)
        url = f"http://127.0.0.1:{port}/api/v1/jobs/{job_id}/log?follow=1"
        with (
            httpx.Client(timeout=httpx.Timeout(5.0, read=60.0)) as client,
            client.stream("GET", url, headers=bearer(token)) as first,
            client.stream("GET", url, headers=bearer(token)) as second,
        ):
            assert first.status_code == second.status_code == 200
            assert first.headers["content-type"].startswith("text/event-stream")
            third = client.get(url, headers=bearer(token))
            assert third.status_code == 429, third.text
            assert "AUTOPILOT_MAX_STREAMS_PER_TOKEN" in third.json()["detail"]
            with client.stream("GET", url, headers=bearer(other)) as theirs:
                assert theirs.status_code == 200  # the cap is per token
            # Ctrl-C with two streams open: the server ends them and stops.
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=30) == 0, (tmp_path / "serve.log").read_text()
            first.read()  # ended by the server: reading it to its end returns
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
