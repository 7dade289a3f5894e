"""`autopilot cycle run|list|show|cancel`: research cycles from the command line."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from sqlalchemy.orm import Session

from app import broker
from app.cli.common import echo_json, exit_on_domain_error, load_settings, open_stores
from app.cycles import service
from app.cycles.models import Cycle
from app.cycles.schemas import CycleOut, StepOut
from app.errors import AutopilotError
from app.jobs import service as jobs

cycle_app = typer.Typer(help="Research cycles: run, list, show, cancel.", no_args_is_help=True)


def _row(session: Session, cycle: Cycle) -> dict[str, Any]:

    out = CycleOut.model_validate(cycle)
    out.job_id = jobs.ids_for_cycles(session, [cycle.id]).get(cycle.id)
    return out.model_dump(mode="json")


@cycle_app.command("run")
def cycle_run(
    project: Annotated[str, typer.Option(help="A registered project")],
    experiment: Annotated[str | None, typer.Option(help="Default: the agent chooses")] = None,
    changed_hypothesis: Annotated[str | None, typer.Option(help="What changed")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow until review or an end")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Trigger a cycle (needs a running control worker to advance it)."""

    settings = load_settings()
    stores = open_stores(settings)
    try:
        with stores.ops_session() as session:
            cycle, _ = service.create(
                session,
                service.Trigger(
                    project=project,
                    experiment=experiment,
                    changed_hypothesis=changed_hypothesis,
                    trigger="cli",
                ),
                max_live=settings.max_live_cycles_per_project,
            )
            cycle_id = cycle.id
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    broker.ring_advance(settings, cycle_id)
    seen = ""
    while True:
        with stores.ops_session() as session:
            row = _row(session, service.get(session, cycle_id))
        if not wait or row["state"] in service.SETTLED:
            break
        if row["state"] != seen and not as_json:
            seen = row["state"]
            typer.echo(f"cycle {cycle_id}: {seen}", err=True)
        time.sleep(0.5)
    _print(row, as_json)
    if wait and row["state"] not in ("awaiting_review", "approved", "skipped_repeat"):
        raise typer.Exit(1)


@cycle_app.command("list")
def cycle_list(
    project: Annotated[str | None, typer.Option()] = None,
    state: Annotated[str | None, typer.Option()] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List recent cycles, newest first."""

    try:
        with open_stores().ops_session() as session:
            rows = [
                _row(session, c)
                for c in service.list_cycles(session, project=project, state=state)[0]
            ]
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(rows)
        return
    for row in rows:
        typer.echo(
            f"{row['id']:5} {row['state']:16} {row['verdict'] or '-':18} "
            f"{row['experiment'] or '-':16} {row['pr_url'] or ''}"
        )


@cycle_app.command("show")
def cycle_show(
    cycle_id: Annotated[int, typer.Argument()],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One cycle with its steps."""

    try:
        with open_stores().ops_session() as session:
            row = _row(session, service.get(session, cycle_id))
            row["steps"] = [
                StepOut.model_validate(s).model_dump(mode="json")
                for s in service.steps(session, cycle_id)
            ]
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    _print(row, as_json)


@cycle_app.command("cancel")
def cycle_cancel(cycle_id: Annotated[int, typer.Argument()]) -> None:
    """Cancel a cycle (and its job, if one is queued or running)."""

    try:
        with open_stores().ops_session() as session:
            service.cancel(session, cycle_id, "cli")
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    typer.echo(f"cancelled cycle {cycle_id}")


def _print(row: dict[str, Any], as_json: bool) -> None:

    if as_json:
        echo_json(row)
        return
    for key in (
        "id",
        "state",
        "experiment",
        "parameters",
        "hypothesis",
        "verdict",
        "headline",
        "pr_url",
        "error",
    ):
        typer.echo(f"{key:12} {row.get(key)}")
    for step in row.get("steps", []):
        typer.echo(
            f"  {step['name']:12} #{step['attempt']} {step['status']:8} {step['detail'] or ''}"
        )
