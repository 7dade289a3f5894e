"""How the `autopilot` command fails: one line naming what failed and what to run, no traceback.

Every command runs through `run`. An operational failure (the stores not migrated, a database,
the broker or the API unreachable, a token refused) prints one `error:` line and exits 2; any
other exception prints one line too and exits 1. `AUTOPILOT_DEBUG=1` shows the traceback.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

import typer
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError, SQLAlchemyError

from app.client import ApiRefused, ApiUnreachable
from app.errors import AutopilotError
from app.redaction import redact_text

OPERATIONAL = 2
UNEXPECTED = 1
DEBUG_VARIABLE = "AUTOPILOT_DEBUG"

# The services' messages name REST routes, which the API keeps; a CLI user gets the command.
_REST_TO_CLI = {
    "GET /api/v1/cycles": "`autopilot cycle list`",
    "GET /api/v1/campaigns": "`autopilot campaign list`",
    "GET /api/v1/jobs": "`autopilot job list`",
    "GET /api/v1/projects": "`autopilot project list`",
    "GET /api/v1/memory/findings": "`autopilot memory search`",
}
# What a database says when a table or column is missing: SQLite, then PostgreSQL.
_NOT_MIGRATED = re.compile(r"no such (table|column)|(relation|column) .* does not exist")


def for_cli(message: str) -> str:
    """`message` with each REST route a service named replaced by the command that does it."""
    for route, command in _REST_TO_CLI.items():
        message = message.replace(route, command)
    return message


def describe(exc: BaseException) -> tuple[str, int]:
    """One line for `exc` (what failed, what to run) and the exit code."""
    if isinstance(exc, ApiUnreachable):
        return (
            f"the API at {exc} is unreachable: check --api / AUTOPILOT_CONTROL_URL and that "
            "`autopilot serve` runs there",
            OPERATIONAL,
        )
    if isinstance(exc, AutopilotError):  # a service's refusal no command caught itself
        return for_cli(exc.detail), OPERATIONAL if exc.status < 500 else UNEXPECTED
    if isinstance(exc, ApiRefused):
        return _refused(exc), OPERATIONAL if exc.status < 500 else UNEXPECTED
    if isinstance(exc, SQLAlchemyError):
        return _database(exc), OPERATIONAL
    broker = _broker(exc)
    if broker is not None:
        return broker, OPERATIONAL
    return (
        f"{type(exc).__name__}: {_first_line(exc)} (set {DEBUG_VARIABLE}=1 for the traceback)",
        UNEXPECTED,
    )


def _refused(exc: ApiRefused) -> str:
    detail = for_cli(exc.detail)
    if exc.status == 401:
        return (
            f"the API at {exc.url} refused the token ({detail}): run `autopilot login --api "
            f"{exc.url}` with a valid one, or set AUTOPILOT_TOKEN"
        )
    if exc.status == 403:
        return f"the API at {exc.url} refused this action for the token: {detail}"
    return detail if exc.status < 500 else f"the API at {exc.url} failed: {detail}"


def _database(exc: SQLAlchemyError) -> str:
    text = _first_line(exc.orig if isinstance(exc, DBAPIError) and exc.orig else exc)
    if isinstance(exc, OperationalError | ProgrammingError) and _NOT_MIGRATED.search(text):
        return f"the stores are not migrated ({text}): run `autopilot db upgrade`"
    if isinstance(exc, OperationalError):
        return (
            f"a database is unreachable ({text}): check AUTOPILOT_OPS_URL and AUTOPILOT_MEMORY_URL "
            "(`autopilot config show`) and that the server is up"
        )
    return f"the database failed ({type(exc).__name__}: {text}); `autopilot db upgrade` may help"


def _broker(exc: BaseException) -> str | None:
    """The broker's connection failures (redis, kombu), which do not share a base class."""
    from kombu.exceptions import OperationalError as KombuOperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    if isinstance(exc, KombuOperationalError | RedisConnectionError | RedisTimeoutError):
        return (
            f"the broker is unreachable ({_first_line(exc)}): check AUTOPILOT_BROKER_URL "
            "(`autopilot config show`) and that it is up"
        )
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return redact_text(lines[0].strip() if lines else type(exc).__name__)


def run(command: Callable[[], object]) -> None:
    """Run the click/typer `command` as the process's main, each failure as one line."""
    try:
        command()
    except Exception as exc:
        if os.environ.get(DEBUG_VARIABLE, "").strip() not in ("", "0"):
            raise
        line, code = describe(exc)
        typer.echo(f"error: {line}", err=True)
        sys.exit(code)
