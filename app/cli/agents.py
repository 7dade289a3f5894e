"""`autopilot agent try`: what an agent would propose now, without starting a cycle."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from app.agents.exceptions import AgentFailed
from app.agents.llm import LLMAgent
from app.agents.service import Proposal, SweepAgent, validate
from app.cli.common import echo_json, exit_on_domain_error, fail, load_settings, open_stores
from app.cycles import agent_context
from app.errors import AutopilotError
from app.forge import service as forge_service
from app.forge.base import ProjectRef
from app.git.work import GitWork
from app.projects import service as projects

agent_app = typer.Typer(help="The research agents: try one without a cycle.", no_args_is_help=True)


@agent_app.command("try")
def agent_try(
    project: Annotated[str, typer.Argument(help="A registered project")],
    agent: Annotated[
        str | None, typer.Option(help="sweep or llm; default: the project's [agent] kind")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Print the proposal an agent would make now: its prompt, its replies, the validation.
    Nothing is started or stored; an LLM agent's tokens are spent on the endpoint."""
    settings = load_settings()
    stores = open_stores(settings)
    try:
        with stores.ops_session() as session:
            row = projects.get_project(session, project)
        forge = forge_service.forge_for(settings, stores)
        _, config = forge_service.config_at_base(GitWork(settings), forge, ProjectRef.of(row))
        name = agent or config.agent.kind
        context = agent_context.build_context(stores, row, config)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    exchange: list[dict[str, Any]] = []
    error: str | None = None
    proposal: Proposal | None = None
    if name == "sweep":
        proposal = SweepAgent().propose(context)
        if proposal is None:
            error = "every point of the declared space is judged or held by a live cycle"
    elif name == "llm":
        try:
            model = LLMAgent.from_settings(settings, config.agent, None, "agent-try")
        except AgentFailed as exc:
            fail(exc.detail)
        try:
            proposal = model.propose(context)
        except AgentFailed as exc:
            error = exc.detail
        exchange = list(model.exchange)
    else:
        fail(
            f"agent {name!r} cannot be tried here: the command agent runs in a cycle's sandboxed "
            f"scratch clone; trigger one with `autopilot cycle run --project {project}`; "
            "try sweep or llm"
        )
    if proposal is not None and error is None:
        try:
            validate(proposal, config)
        except AutopilotError as exc:
            error = f"the proposal is not valid: {exc.detail}"
    out = {
        "project": project,
        "agent": name,
        "proposal": proposal.to_json() if proposal else None,
        "tokens": proposal.tokens if proposal else None,
        "exchange": exchange,
        "error": error,
    }
    if as_json:
        echo_json(out)
    else:
        _show(out)
    if error is not None:
        raise typer.Exit(1)


def _show(out: dict[str, Any]) -> None:
    for turn in out["exchange"]:
        messages = (turn.get("request") or {}).get("messages") or []
        if turn.get("attempt") == 1 and messages:
            for message in messages:
                typer.echo(f"--- prompt ({message.get('role')}) ---\n{message.get('content')}")
        elif messages:
            typer.echo(f"--- sent back ---\n{messages[-1].get('content')}")
        typer.echo(f"--- reply (attempt {turn.get('attempt')}) ---\n{turn.get('reply') or '-'}")
        if turn.get("error"):
            typer.echo(f"--- refused ---\n{turn['error']}")
    if out["proposal"] is not None:
        typer.echo(f"--- proposal ({out['agent']}) ---")
        typer.echo(json.dumps(out["proposal"], indent=2))
    if out["tokens"] is not None:
        typer.echo(f"tokens: {out['tokens']}")
    if out["error"]:
        typer.echo(f"error: {out['error']}", err=True)
