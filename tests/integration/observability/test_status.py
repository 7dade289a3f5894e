"""`autopilot status`: queues, workers, jobs and cycles at a glance, and as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import typer
from typer.testing import CliRunner

from app.cli.status import status_command
from app.cycles.models import Cycle
from app.db import Stores
from app.settings import Settings


@pytest.fixture
def run_status(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> Callable[..., str]:
    app = typer.Typer()
    app.command("status")(status_command)
    app.command("noop")(lambda: None)  # two commands: Typer keeps "status" as a subcommand
    monkeypatch.chdir(str(tmp_path))  # no stray .env
    monkeypatch.setenv("AUTOPILOT_STATE_DIR", str(settings.state_dir))
    monkeypatch.setenv("AUTOPILOT_OPS_URL", settings.ops_database_url)
    monkeypatch.setenv("AUTOPILOT_MEMORY_URL", settings.memory_database_url)

    def run(*args: str, code: int = 0) -> str:
        result = CliRunner().invoke(app, ["status", *args])
        assert result.exit_code == code, result.output
        return result.output

    return run


def test_status_at_a_glance(
    run_status: Callable[..., str],
    stores: Stores,
    add_job: Callable[..., int],
    add_worker: Callable[..., None],
    project_id: int,
) -> None:
    add_job(state="queued", submitted_at=datetime.now(UTC) - timedelta(minutes=5))
    running = add_job(state="running", attempts=2)
    add_worker("gpu-cpu-0@host-a", "0", running, seen_ago_s=1)
    with stores.ops_session() as session:
        session.add(Cycle(project_id=project_id, state="awaiting_review"))

    out = run_status()

    queue_line = next(line for line in out.splitlines() if line.strip().startswith("gpu.cpu "))
    depth, oldest, running_n = queue_line.split()[1:4]
    assert (depth, running_n) == ("1", "1")
    assert oldest in {"300s", "5m"}
    assert "gpu-cpu-0@host-a" in out and f"job {running}" in out
    assert "queued 1" in out and "running 1" in out
    assert "CYCLES" in out and "awaiting_review 1" in out
    assert "lease expiries: 1" in out


def test_status_json(
    run_status: Callable[..., str], add_job: Callable[..., int], add_worker: Callable[..., None]
) -> None:
    add_job(state="queued")
    add_job(queue="gpu.h100", state="succeeded", gpu_seconds=7.0)
    add_worker("gpu-h100-3@host-b", "3", None, seen_ago_s=4)

    data = json.loads(run_status("--json"))

    by_queue = {q["queue"]: q for q in data["queues"]}
    assert by_queue["gpu.cpu"]["queued"] == 1
    assert by_queue["gpu.h100"]["queued"] == 0
    assert data["jobs"] == {"gpu.cpu": {"queued": 1}, "gpu.h100": {"succeeded": 1}}
    assert data["jobs_by_state"] == {"queued": 1, "succeeded": 1}
    (worker,) = data["workers"]
    assert (worker["name"], worker["device"], worker["current_job_id"]) == (
        "gpu-h100-3@host-b",
        "3",
        None,
    )
    assert data["cycles"] == {}


def test_status_says_when_the_store_is_unreachable(
    run_status: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOPILOT_OPS_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    out = run_status(code=2)
    assert "a database is unreachable" in out and "AUTOPILOT_OPS_URL" in out
