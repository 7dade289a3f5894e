"""What every `autopilot` command shares: settings, stores, errors, tables and JSON output.

A leaf: it imports no command module, so each command module imports it at the top.
Bad input exits 2 with one line naming what was wrong; other failures exit 1.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.cli.failures import for_cli
from app.db import Stores
from app.errors import AutopilotError
from app.settings import Settings, describe_validation_error


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load_settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        for line in describe_validation_error(exc):
            typer.echo(f"error: {line}", err=True)
        raise typer.Exit(2) from None


# The root command's `--api` and `--token` for the command it runs. A module's state, not the
# click context's: typer runs commands on its own copy of click, whose context is not public.
# One process runs one command; the root sets both on every run, so nothing carries over.
_GLOBAL_FLAGS: dict[str, str | None] = {}


def set_global_flags(api: str | None, token: str | None) -> None:
    _GLOBAL_FLAGS.clear()
    _GLOBAL_FLAGS.update(api=api, token=token)


def global_flags() -> dict[str, str | None]:
    """`{"api": ..., "token": ...}` as given to the root command; empty when a command runs
    without it (a test invoking a sub-command)."""
    return dict(_GLOBAL_FLAGS)


def refuse_api() -> None:
    """A command that has no remote form refuses an explicit `--api` rather than silently
    acting on this host's stores."""
    if global_flags().get("api"):
        fail(
            "this command works on the control host's stores and has no --api form: run it "
            "there, without --api"
        )


def open_stores(settings: Settings | None = None) -> Stores:
    """This host's stores (see `refuse_api`)."""
    refuse_api()
    return Stores.from_settings(settings or load_settings())


def exit_on_domain_error(exc: AutopilotError) -> NoReturn:
    fail(for_cli(exc.detail), 2 if exc.status < 500 else 1)


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


Column = tuple[str, Callable[[dict[str, Any]], Any]]


def echo_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column], empty: str) -> None:
    """`rows` as a table for a person: one header line, then one line per row, no rules (so
    `grep` and `awk` still work). No rows: the `empty` line, on stderr, says so."""
    if not rows:
        typer.echo(empty, err=True)
        return
    console = Console(highlight=False, soft_wrap=False)
    if not console.is_terminal:
        console.width = 10_000  # piped: no wrapping, each row stays one line
    table = Table(box=None, pad_edge=False, header_style="bold", show_edge=False)
    for title, _ in columns:
        table.add_column(title, overflow="fold")
    for row in rows:
        table.add_row(*(_cell(value(row)) for _, value in columns))
    with console.capture() as captured:
        console.print(table)
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))


def minute(stamp: str | None) -> str | None:
    """An ISO timestamp to the minute, as a person scans a list."""
    return stamp[:16].replace("T", " ") if stamp else None


def _cell(value: Any) -> Text:
    # Text, not a str: a value such as "[unverified]" is shown as it is, never read as markup.
    return Text("-" if value is None or value == "" else str(value))


def describe_fields(exc: ValidationError) -> list[str]:
    """A pydantic error as `field: message` lines, as the CLI prints them."""
    return [
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    ]
