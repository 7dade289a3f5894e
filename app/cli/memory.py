"""`autopilot memory ...`: import, export, search and show findings from the command line.

`search` and `show` also work through the control host's API (`--api`, `app.cli.backend`).
Bad input exits 2 with one line naming what was wrong (the line or field), like the rest of
the `autopilot` command.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated, Any

import typer

from app.cli.backend import choose
from app.cli.common import echo_json, echo_table, exit_on_domain_error, fail, open_stores
from app.errors import AutopilotError
from app.memory import service
from app.memory.exchange import MAX_IMPORT_BYTES
from app.memory.schemas import ExportFormat, ImportFormat, ImportStatus, Kind

memory_app = typer.Typer(
    help="Research memory: import, export, search, show.", no_args_is_help=True
)


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"[:64]
    except (KeyError, OSError):
        return "cli"


@memory_app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(help="The file to import", dir_okay=False)],
    format: Annotated[
        ImportFormat, typer.Option("--format", help="Default: told from the file")
    ] = "auto",
    status: Annotated[
        ImportStatus, typer.Option(help="Status of property-export findings")
    ] = "proposed",
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON")] = False,
) -> None:
    """Import findings; what is already in memory (same content hash) is skipped."""
    try:
        with file.open("rb") as handle:
            data = handle.read(MAX_IMPORT_BYTES + 1)
    except OSError as exc:
        fail(f"{file}: {exc.strerror or exc}")
    stores = open_stores()
    try:
        with stores.memory_session() as session:
            report = service.import_file(
                session, data, format=format, status=status, actor=_actor()
            )
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    finally:
        stores.dispose()
    if as_json:
        echo_json(report.model_dump())
        return
    projects = ", ".join(f"{k}: {v}" for k, v in report.by_project.items()) or "none"
    typer.echo(
        f"imported {report.imported} ({report.format}), {report.duplicates} already present, "
        f"{report.truncated} truncated; by project: {projects}"
    )


@memory_app.command("export")
def export_cmd(
    format: Annotated[ExportFormat, typer.Option("--format")] = "jsonl",
    out: Annotated[Path | None, typer.Option("--out", help="Write here, not to stdout")] = None,
) -> None:
    """Export every finding: JSON Lines (lossless) or Markdown (for people)."""
    stores = open_stores()
    try:
        with stores.memory_session() as session:
            body = service.export(session, format)
    finally:
        stores.dispose()
    if out is None:
        typer.echo(body, nl=False)
        return
    try:
        out.write_text(body, encoding="utf-8")
    except OSError as exc:
        fail(f"{out}: {exc.strerror or exc}")
    typer.echo(f"wrote {out}", err=True)


@memory_app.command("search")
def search_cmd(
    query: Annotated[str, typer.Argument(help="Terms; every one must appear")],
    project: Annotated[str | None, typer.Option()] = None,
    kind: Annotated[Kind | None, typer.Option()] = None,
    status: Annotated[str | None, typer.Option()] = None,
    device_kind: Annotated[str | None, typer.Option("--device")] = None,
    limit: Annotated[int, typer.Option(min=1, max=service.MAX_PAGE)] = 20,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Full-text search (English, Korean, any language), best matches first."""
    try:
        page = choose().search(query, project, kind, status, device_kind, limit)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(page)
        return
    echo_table(
        page["items"],
        [
            ("ID", lambda f: f["id"]),
            ("PROJECT", lambda f: f["project"]),
            ("KIND", lambda f: f["kind"]),
            ("STATUS", _status),
            ("STATEMENT", lambda f: _one_line(f["statement"])),
        ],
        empty=f"no findings match {query!r}" if query.strip() else "no findings yet",
    )


def _status(finding: dict[str, Any]) -> str:
    unverified = " [unverified]" if finding["source_status"] == "unverified" else ""
    return f"{finding['status']}{unverified}"


def _one_line(statement: str, width: int = 100) -> str:
    flat = " ".join(statement.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


@memory_app.command("show")
def show_cmd(
    finding_id: Annotated[str, typer.Argument(help="The finding's id")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One finding with its evidence and audit trail."""
    try:
        found = choose().finding(finding_id)
    except AutopilotError as exc:
        exit_on_domain_error(exc)
    if as_json:
        echo_json(found)
        return
    _print_finding(found)


def _print_finding(found: dict[str, Any]) -> None:
    typer.echo(
        f"{found['id']}  {found['kind']}  {found['status']}  project: {found['project'] or '-'}"
    )
    typer.echo(
        f"source: {found['source_status']}  publication: {found['publication_status']}"
        + ("  truncated" if found.get("truncated") else "")
    )
    typer.echo("")
    typer.echo(found["statement"])
    typer.echo("")
    evidence = {k: v for k, v in (found.get("evidence") or {}).items() if v}
    for key, value in evidence.items():
        typer.echo(f"{key}: {value}")
    for event in found.get("events", []):
        typer.echo(
            f"{event['at']}  {event['from_status'] or '-'} -> {event['to_status']}  "
            f"by {event['actor']}" + (f": {event['reason']}" if event.get("reason") else "")
        )
