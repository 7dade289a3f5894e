"""`autopilot job submit|list|show|cancel|logs`: the GPU handoff queue from the command line.

Talks to the stores directly, like the rest of `app.cli`; the prepare doorbell is rung only
after the submitting session committed. Bad input exits 2 with one line; a followed job that
did not succeed exits 1.
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from app.cli.common import echo_json, exit_on_domain_error, fail, load_settings, open_stores
from app.db import Stores
from app.errors import AutopilotError
from app.jobs import logs, paths
from app.jobs import service as jobs
from app.jobs.models import FINISHED, JOB_STATES
from app.jobs.schemas import JobOut, Scalar
from app.projects import service as ops
from app.settings import Settings

job_app = typer.Typer(
    help="GPU jobs: submit, list, show, cancel, follow their logs.", no_args_is_help=True
)

POLL_S = 0.2


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


def job_row(job: Any, project: str | None = None, **extra: Any) -> dict[str, Any]:
    row = JobOut.model_validate(job).model_dump(mode="json")
    if project is not None:
        row["project"] = project
    row.update(extra)
    return row


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
            jobs.submit_and_ring(stores, settings, project, experiment, parameters, queue=queue),
            project,
        )
    except jobs.DoorbellNotSent as exc:  # the job is stored; the reaper rings again
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
    settings = load_settings()
    try:
        if queue is not None:
            jobs.parse_queue(settings, queue)
        with open_stores(settings).ops_session() as session:
            project_id = ops.get_project(session, project).id if project else None
            names = ops.project_names(session)
            rows = [
                job_row(j, names.get(j.project_id))
                for j in jobs.list_jobs(
                    session, queue=queue, state=state, project_id=project_id, limit=limit
                )
            ]
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(rows)
        return
    if not rows:
        typer.echo("no jobs", err=True)
        return
    typer.echo(f"{'ID':>6}  {'STATE':9}  {'QUEUE':9}  {'PROJECT':24}  {'EXPERIMENT':16}  NOTE")
    for row in rows:
        note = row["error"] or row["wait_reason"] or ""
        if row["state"] == "queued" and not note:
            note = "waiting for a GPU" if row["prepared_at"] else "preparing"
        typer.echo(
            f"{row['id']:>6}  {row['state']:9}  {row['queue']:9}  {row.get('project') or '?':24}  "
            f"{row['experiment']:16}  {note}"
        )


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

    settings = load_settings()
    stores = open_stores(settings)
    try:
        with stores.ops_session() as session:
            job = jobs.get(session, job_id)
            path, tail = logs.stored_log(settings, job), job.log_tail
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if follow:
        state = follow_job(stores, settings, job_id)
        raise typer.Exit(0 if state == "succeeded" else 1)
    chunks = logs.whole_log(path) if path is not None else None
    if chunks is None:
        chunks = iter([(tail or "").encode("utf-8")])
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    last = ""
    for chunk in [*chunks, b""]:
        text = decoder.decode(chunk, final=not chunk)
        if text:
            typer.echo(text, nl=False)
            last = text[-1]
    if last and last != "\n":
        typer.echo("")


# -- following a job ------------------------------------------------------------------------


def phase(job: Any) -> str:
    """What the job is doing, in words: the state, split where a person would ask "why?"."""
    if job.state == "queued":
        if job.prepared_at is None:
            return "queued: preparing (checkout, venv, preflight)"
        if job.wait_reason:
            return f"queued: waiting ({job.wait_reason})"
        return "queued: prepared, waiting for a GPU"
    if job.state in ("leased", "running"):
        return f"{job.state} on {job.worker} (attempt {job.attempts})"
    if job.state == "succeeded":
        return f"succeeded in {job.gpu_seconds:.2f} s GPU time"
    if job.state == "cancelled":
        return f"cancelled by {job.cancelled_by or '?'}"
    return f"failed: {job.error or 'no reason recorded'}"


def follow_job(
    stores: Stores,
    settings: Settings,
    job_id: int,
    *,
    poll_s: float = POLL_S,
    out: Callable[[str], None] | None = None,
    status: Callable[[str], None] | None = None,
) -> str:
    """Print the job's new log lines and each change of its phase until it ends; its last state.

    Log lines go to stdout; the progress display (phase changes with the elapsed time) to
    stderr, so `autopilot job logs 42 -f > run.log` keeps the log clean.
    """

    def echo_out(text: str) -> None:
        typer.echo(text, nl=False)

    def echo_status(line: str) -> None:
        typer.echo(line, err=True)

    write, say = out or echo_out, status or echo_status
    follower = logs.LogFollower()
    shown = ""
    start = time.monotonic()
    try:
        while True:
            with stores.ops_session() as session:
                job = jobs.get(session, job_id)
                now_phase, state = phase(job), job.state
                finished = state in FINISHED
                # the DB's tail while a GPU host runs it; the uploaded log once there is one
                text = follower.read(settings, job, final=finished)
            if text:
                write(text if text.endswith("\n") else text + "\n")
            if now_phase != shown:
                shown = now_phase
                stamp = datetime.now(UTC).strftime("%H:%M:%S")
                say(f"[{stamp} +{time.monotonic() - start:6.1f}s] job {job_id} {now_phase}")
            if follower.behind:
                continue
            if finished:
                return state
            time.sleep(poll_s)
    except KeyboardInterrupt:
        say(f"stopped following; job {job_id} goes on (autopilot job cancel {job_id} stops it)")
        raise typer.Exit(130) from None
