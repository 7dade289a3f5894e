"""The `autopilot` command's control-plane part (Typer). `workers.cli` adds the worker commands.

Bad input exits 2 with one line naming what was wrong; other failures exit 1.
"""

from __future__ import annotations

from typing import Annotated

import typer

from app import migrate
from app.api.main import create_app
from app.cli.agents import agent_app
from app.cli.common import echo_json, load_settings
from app.cli.cycles import cycle_app
from app.cli.jobs import job_app
from app.cli.memory import memory_app
from app.cli.projects import project_app, token_app
from app.cli.status import status_command
from app.logs import configure_logging

cli = typer.Typer(
    name="autopilot",
    help="Research Autopilot: autonomous research cycles on GPU and ML-systems code.",
    no_args_is_help=True,
    add_completion=False,
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
cli.add_typer(agent_app, name="agent")
cli.command("status")(status_command)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (AUTOPILOT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (AUTOPILOT_PORT)")] = None,
) -> None:
    """Serve the REST API and the dashboard."""
    import uvicorn  # heavy, and only this command needs it

    settings = load_settings()
    configure_logging(settings)
    uvicorn.run(
        create_app(settings),
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
    settings = load_settings()
    migrate.upgrade(settings, revision)
    typer.echo(f"memory and ops stores at {revision}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[str, typer.Option(help="Target revision of each store, or 'base'")] = "-1",
) -> None:
    """Step both stores back (default: one revision each). 'base' drops every table."""
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
    cli()
