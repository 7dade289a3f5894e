"""The clocks the harness times with, bound when the harness is first imported.

An entry module imports the harness before its project's code (a shipped project's entry and
its package's `__init__` are protected paths), so these are the interpreter's own clocks even
when the code under test later replaces `time.perf_counter_ns` or any other function of
`time`: the harness keeps timing with what it bound here, and `replaced()` says what was
swapped since (docs/design.md, "Where a number comes from"). A clock already replaced when the
harness loads (by code that ran before it) is recorded in `TAMPERED_AT_IMPORT`.

`monotonic_ns` reads CLOCK_MONOTONIC directly (`time.clock_gettime_ns`), not through the
timer: the harness's cross-check of each timed call (`timing.ClockCheck`) compares the two.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

#: The functions of `time` a timing could be faked through.
WATCHED = (
    "perf_counter_ns",
    "perf_counter",
    "monotonic_ns",
    "monotonic",
    "time_ns",
    "time",
    "clock_gettime_ns",
    "clock_gettime",
    "process_time_ns",
    "thread_time_ns",
)
_BUILTIN = type(len)


def _genuine(name: str) -> bool:
    fn = getattr(time, name, None)
    return type(fn) is _BUILTIN and getattr(fn, "__self__", None) is time and fn.__name__ == name


TAMPERED_AT_IMPORT: tuple[str, ...] = tuple(
    n for n in WATCHED if hasattr(time, n) and not _genuine(n)
)
_BOUND = {name: getattr(time, name) for name in WATCHED if hasattr(time, name)}

perf_counter_ns: Callable[[], int] = time.perf_counter_ns
monotonic_ns: Callable[[], int] = functools.partial(time.clock_gettime_ns, time.CLOCK_MONOTONIC)


def replaced() -> list[str]:
    """The clocks found replaced: when the harness loaded, or in `time` since."""
    now = [f"time.{n}" for n, fn in _BOUND.items() if getattr(time, n, None) is not fn]
    return [f"time.{n} (before the harness loaded)" for n in TAMPERED_AT_IMPORT] + now
