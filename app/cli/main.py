"""The `autopilot` command's control-plane part (Typer). `workers.cli` adds the worker commands.

Bad input and operational failures exit 2 with one line naming what was wrong and what to run
(`app.cli.failures`); other failures exit 1. `--api URL` (or `autopilot login`) sends the read
and trigger commands to a control host's API (`app.cli.backend`).
"""

from __future__ import annotations

import gc
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated

import typer

from app import migrate
from app.api.main import create_app
from app.cli import failures
from app.cli.agents import agent_app
from app.cli.campaigns import campaign_app
from app.cli.common import echo_json, load_settings, refuse_api, set_global_flags
from app.cli.cycles import cycle_app
from app.cli.jobs import job_app
from app.cli.login import login_command, logout_command
from app.cli.memory import memory_app
from app.cli.projects import project_app, token_app
from app.cli.status import status_command
from app.logs import configure_logging

cli = typer.Typer(
    name="autopilot",
    help="Research Autopilot: autonomous research cycles on GPU and ML-systems code.",
    no_args_is_help=True,
    add_completion=True,
)
db_app = typer.Typer(help="Migrate the two stores (memory and ops).", no_args_is_help=True)
config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)
cli.add_typer(db_app, name="db")
cli.add_typer(token_app, name="token")
cli.add_typer(config_app, name="config")
cli.add_typer(project_app, name="project")
cli.add_typer(memory_app, name="memory")
cli.add_typer(job_app, name="job")
cli.add_typer(cycle_app, name="cycle")
cli.add_typer(campaign_app, name="campaign")
cli.add_typer(agent_app, name="agent")
cli.command("status")(status_command)
cli.command("login")(login_command)
cli.command("logout")(logout_command)


def _print_version(given: bool) -> None:
    if given:
        try:
            typer.echo(f"autopilot {version('research-autopilot')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("autopilot (not installed: no version)")
        raise typer.Exit()


@cli.callback()
def root(
    api: Annotated[
        str | None,
        typer.Option(
            "--api",
            help="The control host's API, e.g. http://control.lab:8000 (else "
            "AUTOPILOT_CONTROL_URL, else `autopilot login`'s); for cycle, campaign, "
            "job list|logs, memory search|show and project list",
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="The API token (else AUTOPILOT_TOKEN, else `autopilot login`'s); "
            "a flag shows in the process list: prefer those",
        ),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Research Autopilot: autonomous research cycles on GPU and ML-systems code."""
    set_global_flags(api, token)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (AUTOPILOT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (AUTOPILOT_PORT)")] = None,
) -> None:
    """Serve the REST API and the dashboard."""
    import uvicorn  # heavy, and only this command needs it

    settings = load_settings()
    configure_logging(settings)
    app = create_app(settings)
    # What start-up built (the app, SQLAlchemy's and pydantic's models, ~180,000 objects) lives
    # as long as the process: out of the collector's sight, a full collection no longer walks
    # it (~30-60 ms on this stack, a request's whole latency budget).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        log_config=None,  # keep our JSON handler with secret masking
        host=host or settings.host,
        port=port or settings.port,
        log_level=settings.log_level.lower(),
        proxy_headers=True,
        forwarded_allow_ips=settings.trusted_proxies,
    )


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Option(help="Target revision")] = "head") -> None:
    """Bring both stores to the latest schema (creates the SQLite files if needed)."""
    refuse_api()
    settings = load_settings()
    migrate.upgrade(settings, revision)
    typer.echo(f"memory and ops stores at {revision}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Option(help="Target revision of each store, or 'base'")] = "-1",
) -> None:
    """Step both stores back (default: one revision each). 'base' drops every table."""
    refuse_api()
    migrate.downgrade(load_settings(), revision)
    typer.echo(f"memory and ops stores downgraded to {revision}")


@config_app.command("show")
def config_show(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print the effective settings with every secret redacted."""
    shown = load_settings().redacted()
    if as_json:
        echo_json(shown)
        return
    for key, value in shown.items():
        typer.echo(f"AUTOPILOT_{key.upper()}={value}")


def main() -> None:
    failures.run(cli)
