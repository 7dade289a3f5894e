"""What every `autopilot` command shares: settings, stores, errors and JSON output.

A leaf: it imports no command module, so each command module imports it at the top.
Bad input exits 2 with one line naming what was wrong; other failures exit 1.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import typer
from pydantic import ValidationError

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


def open_stores(settings: Settings | None = None) -> Stores:
    return Stores.from_settings(settings or load_settings())


def exit_on_domain_error(exc: AutopilotError) -> NoReturn:
    fail(exc.detail, 2 if exc.status < 500 else 1)


def echo_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def describe_fields(exc: ValidationError) -> list[str]:
    """A pydantic error as `field: message` lines, as the CLI prints them."""
    return [
        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    ]
