"""How often a repository this process writes (fetches into, pushes to) gets git's upkeep.

Git runs `maintenance run --auto` after every fetch and receive-pack runs `gc --auto` after
every push: a process each, which only counts loose objects and packs and does nothing until
they pass `gc.auto` (6,700 loose objects) or `gc.autoPackLimit` (50 packs). A cycle made 4.7
of them. Running that check once per `every` writes of a repository, or at its first write
after `period_s`, keeps the bound git keeps: between two checks at most `every` writes land,
each of at most `transfer.unpackLimit` (100) loose objects (more arrive as one pack), so a
repository holds at most 6,700 + 25 x 100 loose objects and 50 + 25 packs before the check that
packs them, however many cycles run.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

#: Writes of one repository between two upkeep checks.
EVERY_WRITES = 25
#: A repository written at all gets a check at least this often (while it is written).
PERIOD_S = 300.0
#: Repositories remembered (a registration's scratch repository is written once).
_KEPT = 1024


class Upkeep:
    """Per repository: writes since its last upkeep check, and when that was (per process;
    several processes each keep their own count, so each still checks every `every` writes)."""

    def __init__(
        self,
        every: int = EVERY_WRITES,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every, self.period_s, self._clock = max(1, every), period_s, clock
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def due(self, repo: Path) -> bool:
        """Count one write of `repo`; True when its upkeep check is due now (then counted as
        done). A repository's first write in this process starts its count."""
        key, now = str(repo.absolute()), self._clock()
        with self._lock:
            writes, since = self._seen.pop(key, (0, now))
            writes += 1
            due = writes >= self.every or now - since >= self.period_s
            self._seen[key] = (0, now) if due else (writes, since)
            while len(self._seen) > _KEPT:
                self._seen.popitem(last=False)
            return due
