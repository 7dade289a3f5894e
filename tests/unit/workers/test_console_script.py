"""The `autopilot` console script (`workers.cli:main`): `worker ...` runs the worker commands
alone, anything else the full command."""

from __future__ import annotations

import pytest

from workers import cli


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    monkeypatch.setattr("sys.argv", ["autopilot", *argv])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code in (0, None)
    return capsys.readouterr().out


def test_worker_runs_the_worker_commands_alone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(monkeypatch, capsys, "worker", "--help")
    assert "gpu" in out and "control" in out
    assert "campaign" not in out  # the full command's groups are not loaded for a worker


def test_anything_else_runs_the_full_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = run(monkeypatch, capsys, "--help")
    assert "campaign" in out and "worker" in out
