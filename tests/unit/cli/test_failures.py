"""Each failure the CLI meets becomes one line that names what failed and what to run."""

from __future__ import annotations

from pathlib import Path

from redis.exceptions import ConnectionError as RedisConnectionError
from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError

from app.cli.failures import OPERATIONAL, UNEXPECTED, describe, for_cli
from app.client import ApiRefused, ApiUnreachable


def database_error(url: str, sql: str) -> SQLAlchemyError:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            connection.execute(text(sql))
    except SQLAlchemyError as exc:
        return exc
    finally:
        engine.dispose()
    raise AssertionError("the statement did not fail")


def test_a_store_without_its_tables_says_run_db_upgrade(tmp_path: Path) -> None:
    exc = database_error(f"sqlite:///{tmp_path / 'ops.db'}", "SELECT * FROM project")
    line, code = describe(exc)
    assert code == OPERATIONAL
    assert (
        line == "the stores are not migrated (no such table: project): run `autopilot db upgrade`"
    )


def test_an_unopenable_database_names_the_settings(tmp_path: Path) -> None:
    exc = database_error(f"sqlite:///{tmp_path / 'missing' / 'dir' / 'ops.db'}", "SELECT 1")
    line, code = describe(exc)
    assert code == OPERATIONAL
    assert "unreachable" in line and "AUTOPILOT_OPS_URL" in line


def test_api_failures() -> None:
    refused = ApiRefused("http://control:8000", 401, "invalid or unknown token")
    line, code = describe(refused)
    assert code == OPERATIONAL and "autopilot login --api http://control:8000" in line
    line, code = describe(ApiUnreachable("http://control:8000 (ConnectError: refused)"))
    assert code == OPERATIONAL and "AUTOPILOT_CONTROL_URL" in line
    assert describe(ApiRefused("http://c", 500, "boom"))[1] == UNEXPECTED


def test_rest_routes_in_a_services_message_become_commands() -> None:
    missing = ApiRefused("http://c", 404, "no job 4; list jobs with GET /api/v1/jobs")
    assert describe(missing) == ("no job 4; list jobs with `autopilot job list`", OPERATIONAL)
    assert "`autopilot memory search`" in for_cli("search with GET /api/v1/memory/findings")


def test_broker_and_anything_else() -> None:
    line, code = describe(RedisConnectionError("Error 111 connecting to 127.0.0.1:1."))
    assert code == OPERATIONAL and "AUTOPILOT_BROKER_URL" in line
    line, code = describe(RuntimeError("first line\nsecond line"))
    assert code == UNEXPECTED and line.startswith("RuntimeError: first line (set AUTOPILOT_DEBUG")


def test_a_password_in_a_message_is_hidden() -> None:
    line, _ = describe(RuntimeError("cannot reach redis://:pw-4c1a@cache:6379/0"))
    assert "pw-4c1a" not in line
