"""The `autopilot` console script (`workers.cli:main`).

A command line that starts with `worker` runs the worker commands alone: a GPU host's worker
process then loads none of the control plane's commands, routes and services (it runs jobs, not
cycles). Any other runs the full command (`workers.commands`).
"""

from __future__ import annotations

import sys

from app.cli import failures
from workers.worker_cli import worker_command


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        failures.run(worker_command)  # every failure as one line, as the full command's
        return
    from workers.commands import main as run_full

    run_full()


if __name__ == "__main__":
    main()
