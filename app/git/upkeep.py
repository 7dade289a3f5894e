"""How often a repository this process writes (fetches into, pushes to) gets git's upkeep.

Git runs `maintenance run --auto` after every fetch and receive-pack runs `gc --auto` after
every push: a process each, which only counts loose objects and packs and does nothing until
they pass `gc.auto` (6,700 loose objects) or `gc.autoPackLimit` (50 packs). A cycle made 4.7
of them. This process runs that same check at a repository's first write, then once per
`every` (25) writes of it, or at its first write after `period_s` (5 min). That keeps git's
bound, a little looser: between two checks at most 25 writes land per writing process, each of
at most `transfer.unpackLimit` (100) loose objects (a larger push arrives as one pack), plus a
commit step's few objects a cycle; so with P control processes a repository holds at most
about 6,700 + P x 25 x 100 loose objects and 50 + P x 25 packs before a check packs them,
however many cycles run. 25 makes the check 4% of what it was; a smaller count buys little
(the cost is the process, not the repacking), a much larger one would let packs pile up.
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
        done). A repository's first write in this process is due too: a process that writes
        a repository only a few times before it ends still keeps it checked."""
        key, now = str(repo.absolute()), self._clock()
        with self._lock:
            seen = self._seen.pop(key, None)
            writes, since = seen if seen is not None else (0, now)
            writes += 1
            due = seen is None or writes >= self.every or now - since >= self.period_s
            self._seen[key] = (0, now) if due else (writes, since)
            while len(self._seen) > _KEPT:
                self._seen.popitem(last=False)
            return due
