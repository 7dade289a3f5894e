"""`autopilot project list|create|add` and `autopilot token create|list|revoke`: the research
projects and the API tokens that reach them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from app.cli.backend import choose
from app.cli.common import (
    describe_fields,
    echo_json,
    echo_table,
    exit_on_domain_error,
    fail,
    load_settings,
    open_stores,
)
from app.errors import AutopilotError
from app.forge import service as forge_service
from app.git.work import GitWork
from app.projects import service as ops
from app.projects.schemas import (
    SCOPES,
    ProjectCreate,
    TokenOut,
    check_repo_url,
    refuse_credentials,
)

project_app = typer.Typer(help="Research projects.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)


# -- projects ----------------------------------------------------------------------------------


@project_app.command("add")
def project_add(
    source: Annotated[str, typer.Argument(help="Path or URL of a repository with autopilot.toml")],
    branch: Annotated[str, typer.Option(help="Its default branch")] = "main",
) -> None:
    """Register a research repository; name, GPU kind and budgets come from autopilot.toml."""

    url = str(Path(source).absolute()) if Path(source).exists() else source
    try:
        refuse_credentials(check_repo_url(url))
        _, cfg = forge_service.config_at_url(GitWork(load_settings()), url, branch)
        data = ProjectCreate(
            name=cfg.project.name,
            repo_url=url,
            default_branch=branch,
            gpu_kind=cfg.project.gpu_kind,
        )
    except ValidationError as exc:
        fail("; ".join(describe_fields(exc)))
    except ValueError as exc:  # the URL itself, before anything is fetched
        fail(f"repo_url: {exc}")
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    try:
        with open_stores().ops_session() as session:
            ops.set_budgets(
                session,
                ops.create_project(session, data),
                gpu_hours_per_day=cfg.budgets.gpu_hours_per_day,
                concurrent_gpus=cfg.budgets.concurrent_gpus,
            )
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    typer.echo(f"registered {data.name} ({data.gpu_kind}) from {url}")


@project_app.command("list")
def project_list(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List registered projects."""
    rows = choose().projects()
    if as_json:
        echo_json(rows)
        return
    echo_table(
        rows,
        [
            ("NAME", lambda p: p["name"]),
            ("GPU", lambda p: p["gpu_kind"]),
            ("BRANCH", lambda p: p["default_branch"]),
            ("REPOSITORY", lambda p: p["repo_url"]),
        ],
        empty="no projects yet: register one with `autopilot project add PATH-OR-URL`",
    )


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


# -- tokens ------------------------------------------------------------------------------------


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
