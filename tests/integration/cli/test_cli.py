"""The `autopilot` command as a user runs it: a real subprocess, a real state dir."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest


def autopilot(
    state: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    full_env["AUTOPILOT_STATE_DIR"] = str(state)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=state.parent,
        timeout=120,
        check=False,
    )


def sqlite_tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall()
    return {r[0] for r in rows} - {"alembic_version"}


def test_db_upgrade_creates_two_disjoint_sqlite_files(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = autopilot(state, "db", "upgrade")
    assert result.returncode == 0, result.stderr
    memory, ops = sqlite_tables(state / "memory.db"), sqlite_tables(state / "ops.db")
    assert "finding" in memory and {"project", "api_token"} <= ops
    assert memory.isdisjoint(ops)


def test_token_lifecycle_stores_only_the_hash(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert autopilot(state, "db", "upgrade").returncode == 0
    created = autopilot(state, "token", "create", "--name", "alice", "--scope", "review")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("ap_") and len(token) > 40
    with sqlite3.connect(state / "ops.db") as connection:
        dump = "\n".join(connection.iterdump())
    assert token not in dump
    listed = json.loads(autopilot(state, "token", "list", "--json").stdout)
    assert listed[0]["name"] == "alice" and listed[0]["revoked_at"] is None
    assert token not in json.dumps(listed)
    assert autopilot(state, "token", "revoke", "alice").returncode == 0
    assert json.loads(autopilot(state, "token", "list", "--json").stdout)[0]["revoked_at"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ("token", "create", "--name", "bob", "--scope", "superuser"),
            "scope superuser is not valid",
        ),
        (("token", "create", "--name", "Bad Name", "--scope", "admin"), "is not a slug"),
        (
            ("project", "create", "--name", "UPPER", "--repo-url", "/r"),
            "name: name 'UPPER' is not a slug",
        ),
        (("project", "create", "--name", "p", "--repo-url", "ext::sh"), "repo_url"),
        (
            ("project", "create", "--name", "p", "--repo-url", "https://ghp_x@github.com/o/r"),
            "must not carry credentials",
        ),
        (("project", "add", "https://ghp_x@github.com/o/r"), "must not carry credentials"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], needle: str
) -> None:
    state = tmp_path / "state"
    assert autopilot(state, "db", "upgrade").returncode == 0
    result = autopilot(state, *args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert "ghp_x" not in result.stderr  # a refused URL is not echoed back
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_setting_value_exits_2(tmp_path: Path) -> None:
    result = autopilot(tmp_path / "state", "config", "show", env={"AUTOPILOT_FORGE": "gitlab"})
    assert result.returncode == 2
    assert result.stderr.startswith("error: AUTOPILOT_FORGE:")


def test_config_show_redacts(tmp_path: Path) -> None:
    result = autopilot(
        tmp_path / "state",
        "config",
        "show",
        "--json",
        env={
            "AUTOPILOT_GITHUB_TOKEN": "ghp_leakme",
            "AUTOPILOT_OPS_URL": "postgresql+psycopg://u:pw-leak@h/db",
        },
    )
    assert result.returncode == 0, result.stderr
    assert "ghp_leakme" not in result.stdout and "pw-leak" not in result.stdout
    assert json.loads(result.stdout)["github_token"] == "**********"


def test_duplicate_project_exits_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert autopilot(state, "db", "upgrade").returncode == 0
    assert autopilot(state, "project", "create", "--name", "p1", "--repo-url", "/r").returncode == 0
    again = autopilot(state, "project", "create", "--name", "p1", "--repo-url", "/other")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_help_lists_commands(tmp_path: Path) -> None:
    result = autopilot(tmp_path / "state", "--help")
    for command in ("serve", "db", "token", "config", "project", "doctor"):
        assert command in result.stdout
