"""Faults the tests inject into a real worker process, from the outside of the product:

    python -m tests.faults --exit-after-step committing -- worker control ...

runs the worker (`workers.cli`) with the cycle machine patched so the process dies hard
(`os._exit(137)`, as a SIGKILL would) right after a cycle's step has committed its move and
its attempt was recorded: a crash at the worst moment for the step after it.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from app.cycles import machine


def exit_after_step(state: str) -> None:
    """Patch `Machine._next`: once the attempt of the step for `state` is recorded as done,
    the process exits at once."""
    original = machine.Machine._next

    def _next(self: machine.Machine, cycle_id: int, done: Any) -> Any:
        found = original(self, cycle_id, done)
        if done is not None and done.name == state:
            os._exit(137)
        return found

    machine.Machine._next = _next  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--exit-after-step", metavar="STATE")
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.exit_after_step:
        exit_after_step(args.exit_after_step)
    from workers.cli import main as worker_main

    rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.argv = ["autopilot-worker", *rest]
    worker_main()


if __name__ == "__main__":
    main()
