"""`autopilot campaign start|list|show|stop`: research campaigns (docs/design.md, "Research
lines") from the command line, on the control host's stores or through its API (`--api`, see
`app.cli.backend`)."""

from __future__ import annotations

import time
from typing import Annotated, Any, get_args

import typer
from pydantic import ValidationError

from app.cli.backend import Backend, choose
from app.cli.common import (
    describe_fields,
    echo_json,
    echo_table,
    exit_on_domain_error,
    fail,
    minute,
)
from app.cycles.campaigns.lifecycle import ENDS
from app.cycles.campaigns.schemas import CampaignCreate, CampaignState
from app.cycles.headline import interval_text
from app.errors import AutopilotError

campaign_app = typer.Typer(
    help="Research campaigns: a line of cycles that keeps only confirmed wins, then one pull "
    "request. Start, list, show, stop.",
    no_args_is_help=True,
)

# A campaign's steps take minutes each: a slower poll than a cycle's says no less.
POLL_S = 2.0
STATES = get_args(CampaignState)
DEFAULTS = {name: field.default for name, field in CampaignCreate.model_fields.items()}


@campaign_app.command("start")
def campaign_start(
    project: Annotated[str, typer.Argument(help="A registered project")],
    agent: Annotated[
        str | None, typer.Option(help="Each step's agent (default: the project's autopilot.toml)")
    ] = None,
    experiment: Annotated[
        str | None,
        typer.Option(help="What the final measurement runs (default: the first kept step's)"),
    ] = None,
    max_cycles: Annotated[
        int | None, typer.Option(help=f"Steps at most (default {DEFAULTS['max_cycles']})")
    ] = None,
    parallel: Annotated[
        int | None,
        typer.Option(help=f"Steps at once from the same tip (default {DEFAULTS['parallel']})"),
    ] = None,
    stop_after_no_gain: Annotated[
        int | None, typer.Option(help="End after this many steps in a row are not kept")
    ] = None,
    max_hours: Annotated[
        float | None, typer.Option(help="Start no round after this many hours")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow until it ends")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Start a campaign on a project's base (a control worker drives it)."""

    given = {
        "project": project,
        "agent": agent,
        "experiment": experiment,
        "max_cycles": max_cycles,
        "parallel": parallel,
        "stop_after_no_gain": stop_after_no_gain,
        "max_hours": max_hours,
    }
    try:  # checked here, so a bad value is said the same way locally and through the API
        body = CampaignCreate.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        fail("; ".join(_as_option(line) for line in describe_fields(exc)))
    backend = choose()
    try:
        row = backend.start_campaign(body)
        if wait:
            row = _follow(backend, row, quiet=as_json)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    _print(row, as_json)
    if wait and row["state"] == "failed":
        raise typer.Exit(1)


@campaign_app.command("list")
def campaign_list(
    project: Annotated[str | None, typer.Option()] = None,
    state: Annotated[str | None, typer.Option(help=f"One of {', '.join(STATES)}")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 100,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List campaigns, newest first."""

    if state is not None and state not in STATES:
        fail(f"--state {state!r} is not a campaign's state; one of {', '.join(STATES)}")
    try:
        rows = choose().campaigns(project, state, limit)
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
            ("PROJECT", lambda r: r["project"]),
            ("STATE", lambda r: r["state"]),
            ("STEPS", lambda r: f"{len(r['steps'])}/{r['max_cycles']}"),
            ("KEPT", lambda r: r["kept"]),
            ("CUMULATIVE", lambda r: _cumulative(r["cumulative"], short=True)),
            ("CREATED", lambda r: minute(r["created_at"])),
            ("PR", lambda r: r["pr_url"]),
        ],
        empty=f"no campaigns match {filters}"
        if filters
        else "no campaigns yet: start one with `autopilot campaign start PROJECT`",
    )


@campaign_app.command("show")
def campaign_show(
    campaign_id: Annotated[int, typer.Argument()],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One campaign: its line, its steps and why each was kept or not, the cumulative result."""

    try:
        row = choose().campaign(campaign_id)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    _print(row, as_json)


@campaign_app.command("stop")
def campaign_stop(
    campaign_id: Annotated[int, typer.Argument()],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Stop a campaign: no new step, the live ones cancelled, a pull request of what it kept."""

    try:
        row = choose().stop_campaign(campaign_id)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(row)
        return
    typer.echo(
        f"stopping campaign {campaign_id}: no new step starts, its live steps are cancelled, "
        "and it ends stopped with a pull request of what it kept"
    )


def _follow(backend: Backend, row: dict[str, Any], *, quiet: bool) -> dict[str, Any]:
    """Poll the campaign until it ends, saying each change of its progress on stderr."""
    seen = ""
    try:
        while row["state"] not in ENDS:
            now = (
                f"{row['state']}, round {row['round']}, {len(row['steps'])} step(s), "
                f"{row['kept']} kept"
            )
            if now != seen and not quiet:
                seen = now
                typer.echo(f"campaign {row['id']}: {now}", err=True)
            time.sleep(POLL_S)
            row = backend.campaign(row["id"])
    except KeyboardInterrupt:
        typer.echo(
            f"stopped following; campaign {row['id']} goes on "
            f"(`autopilot campaign stop {row['id']}` stops it)",
            err=True,
        )
        raise typer.Exit(130) from None
    return row


def _as_option(line: str) -> str:
    """`max_cycles: <message>` as the person typed it: `--max-cycles: <message>`."""
    field, sep, message = line.partition(": ")
    name = field if field == "project" else f"--{field.replace('_', '-')}"
    return f"{name}{sep}{message}"


def _figures(ratio: Any, low: Any, high: Any) -> str | None:
    """`0.812 [0.780, 0.845]`, the ratio alone without its interval, or None without one."""
    shown = interval_text({"ratio": ratio, "ci_low": low, "ci_high": high})
    if shown is None and isinstance(ratio, int | float):
        return f"{ratio:.3f}"
    return shown


def _cumulative(cumulative: dict[str, Any] | None, *, short: bool = False) -> str | None:
    """The line's tip against its start, as the final measurement judged it."""
    if not cumulative:
        return None if short else "not measured yet (the final measurement ends the campaign)"
    c = cumulative
    figures = _figures(c.get("ratio"), c.get("ci_low"), c.get("ci_high"))
    if figures is None:
        return "not measured" if short else f"not measured: {c.get('error') or 'no ratio'}"
    if short:
        return f"{figures} {c.get('verdict') or ''}".strip()
    verdict = c.get("verdict") or "no verdict"
    return f"ratio {figures} (tip / start), {verdict}, cycle {c.get('cycle_id')}"


def _print(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        echo_json(row)
        return
    steps = row.get("steps") or []
    for key, value in (
        ("id", row["id"]),
        ("project", row["project"]),
        ("state", row["state"]),
        ("line", row["line_branch"]),
        ("start", row["start_sha"]),
        ("tip", row["tip_sha"]),
        ("steps", f"{len(steps)} of at most {row['max_cycles']}, {row['kept']} kept"),
        ("cumulative", _cumulative(row["cumulative"])),
        ("pr_url", row["pr_url"]),
        ("end_reason", row["end_reason"]),
        ("error", row["error"]),
    ):
        typer.echo(f"{key:12} {'-' if value is None else value}")
    if steps:
        typer.echo("")
        echo_table(
            steps,
            [
                ("CYCLE", lambda s: s["cycle_id"]),
                ("ROUND", lambda s: s["round"]),
                ("STATE", lambda s: s["state"]),
                ("OUTCOME", lambda s: s["outcome"]),
                ("REASON", lambda s: s["reason"]),
                ("RATIO [CI]", lambda s: _figures(s["ratio"], s["ci_low"], s["ci_high"])),
                ("CONFIRMED BY", lambda s: s["confirmation_cycle_id"]),
                ("HYPOTHESIS", lambda s: s["hypothesis"]),
                ("WHY", lambda s: s["sentence"]),
            ],
            empty="",
        )
