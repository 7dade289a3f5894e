"""The control worker's thread count is sized to the machine (issue 18: bench/fleet.py), and an
explicit --concurrency still wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from app.settings import Settings
from workers import worker_cli
from workers.worker_cli import control_argv, control_concurrency


def test_sized_to_the_cores_within_bounds() -> None:
    assert [control_concurrency(c) for c in (1, 2, 3, 4, 16)] == [8, 8, 12, 16, 16]


def test_the_argv_carries_the_threads(tmp_path: Path) -> None:
    fs = Settings(_env_file=None, state_dir=tmp_path)  # type: ignore[call-arg]
    argv = control_argv(fs, control_concurrency(2), "INFO", beat=False)
    assert argv[argv.index("-P") + 1] == "threads"
    assert argv[argv.index("-c") + 1] == "8"


def test_the_command_sizes_it_unless_told(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[list[str]] = []
    monkeypatch.setenv("AUTOPILOT_STATE_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOPILOT_SANDBOX", "off")
    monkeypatch.setattr(worker_cli.os, "cpu_count", lambda: 3)
    from workers.celery_app import celery

    monkeypatch.setattr(celery, "worker_main", lambda argv: seen.append(argv))
    runner = CliRunner()
    assert runner.invoke(worker_cli.worker_app, ["control"]).exit_code == 0
    assert runner.invoke(worker_cli.worker_app, ["control", "--concurrency", "2"]).exit_code == 0
    assert [argv[argv.index("-c") + 1] for argv in seen] == ["12", "2"]
