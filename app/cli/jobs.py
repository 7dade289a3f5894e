"""`autopilot job submit|list|show|cancel|logs`: the GPU handoff queue from the command line.

`list` and `logs` also work through the control host's API (`--api`, `app.cli.backend`); the
others act on this host's stores. The prepare doorbell is rung only after the submitting
session committed. Bad input exits 2 with one line; a followed job that
did not succeed exits 1.
"""

from __future__ import annotations

import codecs
import json
from typing import Annotated, Any

import typer

from app.cli.backend import choose
from app.cli.common import (
    echo_json,
    echo_table,
    exit_on_domain_error,
    fail,
    load_settings,
    open_stores,
)
from app.cli.local import follow_job, job_row
from app.errors import AutopilotError
from app.jobs import paths, submission
from app.jobs import service as jobs
from app.jobs.lifecycle import JOB_STATES
from app.jobs.schemas import Scalar
from app.projects import service as ops

__all__ = ["follow_job", "job_app", "parse_param"]

job_app = typer.Typer(
    help="GPU jobs: submit, list, show, cancel, follow their logs.", no_args_is_help=True
)


def parse_param(text: str) -> tuple[str, Scalar]:
    """`key=value`; the value is read as a JSON scalar when it is one (3, 0.5, true, "x")."""

    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        fail(f"--param {text!r}: expected key=value, e.g. --param sleep_s=0.5")
    try:
        value = json.loads(raw)
    except ValueError:
        return key, raw
    if isinstance(value, bool | int | float | str):
        return key, value
    return key, raw  # a list, object or null is not a parameter value: keep the text


@job_app.command("submit")
def job_submit(
    project: Annotated[str, typer.Option(help="A registered project's name")],
    experiment: Annotated[str, typer.Option(help="An experiment declared in autopilot.toml")],
    param: Annotated[
        list[str] | None, typer.Option(help="Repeatable key=value (values read as JSON scalars)")
    ] = None,
    queue: Annotated[
        str | None, typer.Option(help="gpu.<kind>; default: the project's GPU kind")
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Follow the job until it ends")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Submit a standalone job; it is prepared off the GPU, then queued in submission order."""

    parameters: dict[str, Scalar] = {}
    for text in param or []:
        key, value = parse_param(text)
        if key in parameters:
            fail(f"--param {key} given twice")
        parameters[key] = value
    settings = load_settings()
    stores = open_stores(settings)
    try:
        shown = job_row(
            submission.submit_and_ring(
                stores, settings, project, experiment, parameters, queue=queue
            ),
            project,
        )
    except submission.DoorbellNotSent as exc:  # the job is stored; the reaper rings again
        shown = job_row(exc.job, project)
        typer.echo(
            f"warning: job {shown['id']} is stored but its doorbell was not sent "
            f"({type(exc.cause).__name__}); the reaper will ring it",
            err=True,
        )
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json and not follow:
        echo_json(shown)
        return
    typer.echo(
        f"submitted job {shown['id']}: {project}/{experiment} on {shown['queue']} "
        f"{json.dumps(shown['parameters'], sort_keys=True)}",
        err=follow,
    )
    if follow:
        state = follow_job(stores, settings, shown["id"])
        raise typer.Exit(0 if state == "succeeded" else 1)


@job_app.command("list")
def job_list(
    queue: Annotated[str | None, typer.Option(help="gpu.<kind>")] = None,
    state: Annotated[str | None, typer.Option(help=" | ".join(JOB_STATES))] = None,
    project: Annotated[str | None, typer.Option(help="A project's name")] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """List jobs, newest first."""

    if state is not None and state not in JOB_STATES:
        fail(f"--state {state!r}: expected one of {', '.join(JOB_STATES)}")
    try:
        rows = choose().jobs(queue, state, project, limit)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(rows)
        return
    filters = " ".join(
        f"--{k} {v}" for k, v in (("queue", queue), ("state", state), ("project", project)) if v
    )
    echo_table(
        rows,
        [
            ("ID", lambda r: r["id"]),
            ("STATE", lambda r: r["state"]),
            ("QUEUE", lambda r: r["queue"]),
            ("PROJECT", lambda r: r.get("project") or "?"),
            ("EXPERIMENT", lambda r: r["experiment"]),
            ("NOTE", _note),
        ],
        empty=f"no jobs match {filters}" if filters else "no jobs yet",
    )


def _note(row: dict[str, Any]) -> str:
    note: str = row["error"] or row["wait_reason"] or ""
    if row["state"] == "queued" and not note:
        note = "waiting for a GPU" if row["prepared_at"] else "preparing"
    elif row["state"] == "reserved" and not note:
        note = "next on a busy worker's GPU"
    return note


@job_app.command("show")
def job_show(
    job_id: Annotated[int, typer.Argument(help="The job's id")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Show one job: state, timings, outcome, where its log and result are."""

    settings = load_settings()
    try:
        with open_stores(settings).ops_session() as session:
            job = jobs.get(session, job_id)
            row = job_row(
                job,
                ops.project_names(session).get(job.project_id),
                exit_code=job.exit_code,
                time_limit_s=job.time_limit_s,
                log_path=str(paths.log_path(settings, job_id, job.log_path)),
                result_path=job.result_path,
            )
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(row)
        return
    for key, value in row.items():
        if value is None or value == {}:
            continue
        shown = json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
        typer.echo(f"{key:20} {shown}")


@job_app.command("cancel")
def job_cancel(job_id: Annotated[int, typer.Argument(help="The job's id")]) -> None:
    """Cancel a job: a queued one at once; a running one is stopped at its next heartbeat."""

    try:
        with open_stores().ops_session() as session:
            state = jobs.cancel(session, job_id, by="cli").state
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if state == "cancelled":
        typer.echo(f"cancelled job {job_id}")
    else:
        typer.echo(
            f"cancellation of job {job_id} requested ({state}); its worker kills it at the next "
            "heartbeat"
        )


@job_app.command("logs")
def job_logs(
    job_id: Annotated[int, typer.Argument(help="The job's id")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Follow until it ends")] = False,
) -> None:
    """Print a job's log (the whole log once its GPU host uploaded it, else the tail the DB keeps);
    with --follow, stream it with the job's progress until it ends."""

    backend = choose()
    try:
        if follow:
            state = backend.follow_job(job_id, _write, _say)
            raise typer.Exit(0 if state == "succeeded" else 1)
        chunks = backend.job_log(job_id)
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        last = ""
        for chunk in [*chunks, b""]:
            text = decoder.decode(chunk, final=not chunk)
            if text:
                typer.echo(text, nl=False)
                last = text[-1]
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    except KeyboardInterrupt:
        _say(f"stopped following; job {job_id} goes on (autopilot job cancel {job_id} stops it)")
        raise typer.Exit(130) from None
    if last and last != "\n":
        typer.echo("")


def _write(text: str) -> None:
    typer.echo(text, nl=False)


def _say(line: str) -> None:
    typer.echo(line, err=True)
