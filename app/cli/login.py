"""`autopilot login|logout`: keep the control host's API URL and a token for the CLI's remote
commands in the CLI's own config file (mode 0600), so a laptop needs neither flags nor env."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from app.cli.backend import check_url, config_path
from app.cli.common import fail, global_flags
from app.client import ControlClient


def login_command(
    api: Annotated[
        str | None, typer.Option("--api", help="The API's base URL, e.g. http://control.lab:8000")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Default: read from stdin when piped, else prompted (never echoed)"),
    ] = None,
) -> None:
    """Check a token against the control host's API and save both for later commands."""
    given = api or global_flags().get("api")
    if not given:
        fail("--api is missing: the control host's API, e.g. --api http://control.lab:8000")
    url = check_url(given, "--api")
    secret = (token or global_flags().get("token") or _read_token()).strip()
    if not secret:
        fail("no token given: pass --token, pipe it on stdin or type it at the prompt")
    client = ControlClient(url, secret)
    try:
        client.get("/projects")  # any reader's route: a refused token fails here, not later
    finally:
        client.close()
    path = config_path()
    _write_private(
        path,
        f"# written by `autopilot login`\napi = {json.dumps(url)}\ntoken = {json.dumps(secret)}\n",
    )
    typer.echo(f"logged in to {url}; the token is saved in {path} (mode 0600)")


def logout_command() -> None:
    """Forget the saved API URL and token."""
    path = config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        typer.echo(f"not logged in ({path} does not exist)")
        return
    typer.echo(f"removed {path}")


def _read_token() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline()
    entered: str = typer.prompt("token", hide_input=True)
    return entered


def _write_private(path: Path, text: str) -> None:
    """Write `text` readable by its owner only, replacing the file at once (never half-written,
    never briefly world-readable)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".config-", suffix=".toml")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:  # mkstemp makes it 0600
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
