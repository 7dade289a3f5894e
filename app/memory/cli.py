"""`autopilot memory ...` commands (filled by the memory issue)."""

import typer

memory_app = typer.Typer(help="Research memory: import, export, search, show.", no_args_is_help=True)
