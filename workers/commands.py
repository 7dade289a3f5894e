"""The full `autopilot` command: the control-plane commands plus those that run on worker hosts
(`workers.cli` runs it for every command line but `autopilot worker ...`).

It lives in `workers` so that `app` never imports `workers` (dependencies point one way).
"""

from __future__ import annotations

from app.cli.main import cli
from app.cli.main import main as run_cli
from workers.demo import demo_command
from workers.launcher.cli import doctor_app
from workers.worker_cli import beat_command, worker_app

cli.add_typer(doctor_app, name="doctor")
cli.add_typer(worker_app, name="worker")
cli.command("beat")(beat_command)
cli.command("demo")(demo_command)


def main() -> None:
    run_cli()  # every failure as one line (app.cli.failures)
