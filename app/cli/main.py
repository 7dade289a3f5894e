"""The `autopilot` command's control-plane part (Typer). `workers.cli` adds the worker commands.

Bad input exits 2 with one line naming what was wrong; other failures exit 1.
"""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from app import migrate
from app.cli.common import (
    describe_fields,
    echo_json,
    exit_on_domain_error,
    fail,
    load_settings,
    open_stores,
)
from app.cli.cycles import cycle_app, project_add
from app.cli.jobs import job_app
from app.cli.memory import memory_app
from app.cli.status import status_command
from app.errors import AutopilotError
from app.logs import configure_logging
from app.projects import service as ops
from app.projects.schemas import SCOPES, ProjectCreate, TokenOut

cli = typer.Typer(
    name="autopilot",
    help="Research Autopilot: autonomous research cycles on GPU and ML-systems code.",
    no_args_is_help=True,
    add_completion=False,
)
db_app = typer.Typer(help="Migrate the two stores (memory and ops).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)
config_app = typer.Typer(help="Inspect the effective settings.", no_args_is_help=True)
project_app = typer.Typer(help="Research projects.", no_args_is_help=True)
cli.add_typer(db_app, name="db")
cli.add_typer(token_app, name="token")
cli.add_typer(config_app, name="config")
cli.add_typer(project_app, name="project")
cli.add_typer(memory_app, name="memory")
cli.add_typer(job_app, name="job")
cli.add_typer(cycle_app, name="cycle")
project_app.command("add")(project_add)
cli.command("status")(status_command)


@cli.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (AUTOPILOT_HOST)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (AUTOPILOT_PORT)")] = None,
) -> None:
    """Serve the REST API and the dashboard."""
    import uvicorn

    from app.api.main import create_app

    settings = load_settings()
    configure_logging(settings)
    uvicorn.run(
        create_app(settings),
        log_config=None,  # keep our JSON handler with secret masking
        host=host or settings.host,
        port=port or settings.port,
        log_level=settings.log_level.lower(),
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


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="A slug naming the token's holder")],
    scope: Annotated[list[str], typer.Option(help=f"Repeatable: {', '.join(SCOPES)}")],
) -> None:
    """Create a token. It is printed once; only its hash is stored."""
    stores = open_stores()
    try:
        with stores.ops_session() as session:
            _, token = ops.create_token(session, name, scope)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    typer.echo(token)


@token_app.command("list")
def token_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List tokens (names, scopes, state; never the tokens)."""
    with open_stores().ops_session() as session:
        tokens = list(ops.list_tokens(session))
    if as_json:
        echo_json([TokenOut.model_validate(t).model_dump(mode="json") for t in tokens])
        return
    for token in tokens:
        state = "revoked" if token.revoked_at else "active"
        typer.echo(f"{token.name:24} {','.join(token.scopes):24} {state}")


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Argument(help="The token's name")]) -> None:
    """Revoke a token by name; it stops working at once."""
    try:
        with open_stores().ops_session() as session:
            ops.revoke_token(session, name)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    typer.echo(f"revoked {name}")


@config_app.command("show")
def config_show(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print the effective settings with every secret redacted."""
    shown = load_settings().redacted()
    if as_json:
        echo_json(shown)
        return
    for key, value in shown.items():
        typer.echo(f"AUTOPILOT_{key.upper()}={value}")


@project_app.command("list")
def project_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List registered projects."""
    with open_stores().ops_session() as session:
        rows = [
            {"name": p.name, "repo_url": p.repo_url, "gpu_kind": p.gpu_kind}
            for p in ops.list_projects(session)
        ]
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        typer.echo(f"{row['name']:32} {row['gpu_kind']:8} {row['repo_url']}")


@project_app.command("create")
def project_create(
    name: Annotated[str, typer.Option(help="Project slug")],
    repo_url: Annotated[str, typer.Option(help="Absolute path or git URL")],
    default_branch: Annotated[str, typer.Option()] = "main",
    gpu_kind: Annotated[str, typer.Option()] = "cpu",
) -> None:
    """Register a project by name and repository."""
    try:
        data = ProjectCreate(
            name=name, repo_url=repo_url, default_branch=default_branch, gpu_kind=gpu_kind
        )
    except ValidationError as exc:
        fail("; ".join(describe_fields(exc)))
    try:
        with open_stores().ops_session() as session:
            ops.create_project(session, data)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    typer.echo(f"registered {name}")


def main() -> None:
    cli()
