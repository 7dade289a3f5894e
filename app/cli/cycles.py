"""`autopilot cycle run|list|show|cancel`: research cycles from the command line, on the control
host's stores or through its API (`--api`, see `app.cli.backend`)."""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer

from app.cli.backend import choose
from app.cli.common import echo_json, echo_table, exit_on_domain_error, minute
from app.cycles.states import SETTLED
from app.errors import AutopilotError

cycle_app = typer.Typer(help="Research cycles: run, list, show, cancel.", no_args_is_help=True)

POLL_S = 0.5


@cycle_app.command("run")
def cycle_run(
    project: Annotated[str, typer.Option(help="A registered project")],
    experiment: Annotated[str | None, typer.Option(help="Default: the agent chooses")] = None,
    changed_hypothesis: Annotated[str | None, typer.Option(help="What changed")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow until review or an end")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Trigger a cycle (a control worker advances it)."""

    backend = choose()
    try:
        row = backend.trigger(project, experiment, changed_hypothesis)
        seen = ""
        while wait and row["state"] not in SETTLED:
            if row["state"] != seen and not as_json:
                seen = row["state"]
                typer.echo(f"cycle {row['id']}: {seen}", err=True)
            time.sleep(POLL_S)
            row = backend.cycle(row["id"])
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    _print(row, as_json)
    if wait and row["state"] not in ("awaiting_review", "approved", "skipped_repeat"):
        raise typer.Exit(1)


@cycle_app.command("list")
def cycle_list(
    project: Annotated[str | None, typer.Option()] = None,
    state: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 100,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List recent cycles, newest first."""

    try:
        rows = choose().cycles(project, state, limit)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(rows)
        return
    filters = " ".join(f"--{k} {v}" for k, v in (("project", project), ("state", state)) if v)
    echo_table(
        rows,
        [
            ("ID", lambda r: r["id"]),
            ("STATE", lambda r: r["state"]),
            ("VERDICT", lambda r: r["verdict"]),
            ("EXPERIMENT", lambda r: r["experiment"]),
            ("CREATED", lambda r: minute(r["created_at"])),
            ("PR", lambda r: r["pr_url"]),
        ],
        empty=f"no cycles match {filters}"
        if filters
        else "no cycles yet: start one with `autopilot cycle run --project NAME`",
    )


@cycle_app.command("show")
def cycle_show(
    cycle_id: Annotated[int, typer.Argument()],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One cycle with its steps."""

    try:
        row = choose().cycle(cycle_id)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    _print(row, as_json)


@cycle_app.command("cancel")
def cycle_cancel(cycle_id: Annotated[int, typer.Argument()]) -> None:
    """Cancel a cycle (and its job, if one is queued or running)."""

    try:
        choose().cancel_cycle(cycle_id)
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
    steps = row.get("steps") or []
    if steps:
        typer.echo("")
        echo_table(
            steps,
            [
                ("STEP", lambda s: s["name"]),
                ("ATTEMPT", lambda s: s["attempt"]),
                ("STATUS", lambda s: s["status"]),
                ("DETAIL", lambda s: s["detail"]),
            ],
            empty="",
        )
