"""`autopilot doctor venv` and `doctor runtime` through the Typer app."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from workers.launcher.cli import doctor_app
from workers.launcher.venv import Venv

runner = CliRunner()


@pytest.fixture(autouse=True)
def _state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOPILOT_STATE_DIR", str(tmp_path / "state"))


def test_doctor_venv_passes_on_a_good_venv(venv: Venv, tmp_path: Path) -> None:
    (tmp_path / "myexp.py").write_text("X = 1\n")
    res = runner.invoke(
        doctor_app,
        [
            "venv",
            str(venv.path),
            "--entry",
            "myexp",
            "--cwd",
            str(tmp_path),
            "--env",
            "OMP_NUM_THREADS=1",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "PASS" in res.output
    res = runner.invoke(
        doctor_app, ["venv", str(venv.path), "--entry", "myexp", "--cwd", str(tmp_path), "--json"]
    )
    report = json.loads(res.output)
    assert report["ok"] is True
    assert report["modules"]["myexp"] == [str(tmp_path / "myexp.py")]


def test_doctor_venv_fails_with_the_reason(venv: Venv, tmp_path: Path) -> None:
    res = runner.invoke(doctor_app, ["venv", str(tmp_path), "--json"])
    assert res.exit_code == 1
    assert "no pyvenv.cfg" in json.loads(res.output)["checks"][0]["detail"]
    res = runner.invoke(doctor_app, ["venv", str(venv.path), "--entry", "no_such_mod_q"])
    assert res.exit_code == 1
    assert "FAIL" in res.output and "no_such_mod_q" in res.output
    res = runner.invoke(doctor_app, ["venv", str(venv.path), "--env", "GITHUB_TOKEN=x"])
    assert res.exit_code == 1
    assert "GITHUB_TOKEN" in res.output


def test_doctor_runtime_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long_tmp = tmp_path / ("t" * (150 - len(str(tmp_path)) - 1))
    long_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(long_tmp))
    res = runner.invoke(doctor_app, ["runtime", "--suffix-len", "50", "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert {"runtime_dir", "longest_socket_path", "budget", "alias"} <= set(info)
    assert info["budget"] == 107
    assert info["alias"] is None
    assert len(info["longest_socket_path"]) == info["longest_socket_len"] <= 107
    assert info["candidates"][0]["source"] == "TMPDIR"
    assert "too long" in info["candidates"][0]["passed_over"]
    assert not os.path.exists(info["runtime_dir"])  # doctor leaves nothing behind
    res = runner.invoke(doctor_app, ["runtime"])
    assert res.exit_code == 0
    assert "longest path" in res.output and "chosen" in res.output


def test_doctor_runtime_fails_when_nothing_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = runner.invoke(doctor_app, ["runtime", "--suffix-len", "200", "--json"])
    assert res.exit_code == 1
    info = json.loads(res.output)
    assert info["ok"] is False
    assert "budget" in info["error"]
