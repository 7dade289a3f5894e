"""Faults the tests inject into a real worker process, from the outside of the product:

    python -m tests.faults --exit-after-step committing -- worker control ...

runs the worker (`workers.cli`) with the cycle machine patched so the process dies hard
(`os._exit(137)`, as a SIGKILL would) right after a cycle's step has committed its move and
its attempt was recorded: a crash at the worst moment for the step after it.

    python -m tests.faults --exit-campaign-at advanced --once-dir D -- worker control ...

dies right after a campaign's driver pushed its line to a kept step, before the ops DB
records it (`advanced`), or right after it opened the campaign's pull request, before it
records it (`published`): each at most once per `--once-dir` (a file there marks it done),
so the worker started again after the crash goes on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from app.cycles import machine
from app.cycles.campaigns import line
from app.forge import service as forge_service


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


def exit_campaign_at(where: str, once_dir: Path) -> None:
    """Patch the campaign driver's git or forge call for `where` to die right after it."""
    mark = once_dir / f"{where}.done"

    def die_once() -> None:
        if not mark.exists():
            mark.write_text("")
            os._exit(137)

    if where == "advanced":
        advance = line.advance

        def _advance(*args: Any, **kwargs: Any) -> None:
            advance(*args, **kwargs)
            die_once()

        line.advance = _advance  # type: ignore[assignment]
    elif where == "published":
        publish = forge_service.publish

        def _publish(*args: Any, **kwargs: Any) -> Any:
            found = publish(*args, **kwargs)
            if str(args[4]).startswith("campaign-"):
                die_once()
            return found

        forge_service.publish = _publish  # type: ignore[assignment]
    else:
        raise SystemExit(f"--exit-campaign-at: {where!r} is not advanced or published")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.faults")
    parser.add_argument("--exit-after-step", metavar="STATE")
    parser.add_argument("--exit-campaign-at", action="append", default=[], metavar="WHERE")
    parser.add_argument("--once-dir", type=Path)
    parser.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    if args.exit_after_step:
        exit_after_step(args.exit_after_step)
    for where in args.exit_campaign_at:
        exit_campaign_at(where, args.once_dir)
    from workers.cli import main as worker_main

    rest = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    sys.argv = ["autopilot-worker", *rest]
    worker_main()


if __name__ == "__main__":
    main()
