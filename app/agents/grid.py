"""A sweep's walk over its parameter space, with each point's fingerprint made once a process.

The sweep proposes the first point of the space (in the grid's order) that nothing covers, so
every plan walks past every point earlier cycles took: at 15,000 held points that walk was
~100 ms of a plan's time under the project's lock, almost all of it making each point's
fingerprint (a canonical JSON and a SHA-256) to ask whether it is covered
(`bench/plan_history.py`). The points and their fingerprints depend only on the project, the
device kind and the experiment's declared space, so they are kept here, in the grid's order, for
the next plan: a walk past a point already made is a set lookup.

What is kept is bounded: `MAX_GRIDS` spaces, and the first `MAX_POINTS` points of each (a walk
further on makes the rest as it goes, as before).
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from typing import Any

MAX_GRIDS = 16
MAX_POINTS = 200_000
_CHUNK = 1024

Fingerprint = Callable[[str, dict[str, Any]], str]


def points(space: dict[str, list[Any]]) -> Iterator[dict[str, Any]]:
    """The space's points in the grid's order: the last parameter varies fastest."""
    keys = list(space)
    for values in itertools.product(*(space[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def filled(space: dict[str, list[Any]], defaults: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The space's points in the grid's order, each with the experiment's defaults under it."""
    return ({**defaults, **p} for p in points(space))


class Grid:
    """One experiment's points (its defaults filled in) with their fingerprints, made as far as
    a walk has needed them. Safe to walk from several threads: what is kept only grows, in
    order, under a lock."""

    def __init__(
        self,
        experiment: str,
        space: dict[str, list[Any]],
        defaults: dict[str, Any],
        fingerprint: Fingerprint,
    ) -> None:
        self._experiment, self._space, self._defaults = experiment, space, defaults
        self._fingerprint = fingerprint
        self._source = self._points()
        self._made: list[tuple[dict[str, Any], str]] = []
        self._exhausted = False
        self._lock = threading.Lock()

    def uncovered(self, covered: AbstractSet[str]) -> Iterator[dict[str, Any]]:
        """The points whose fingerprint `covered` does not hold, in the grid's order; each a
        copy the caller may keep. The points passed cost a set lookup each."""
        index = 0
        while True:
            made = self._made
            while index < len(made):
                params, fp = made[index]
                index += 1
                if fp not in covered:
                    yield dict(params)
            if not self._extend() and index >= len(self._made):
                break
        if not self._exhausted:  # what is kept is full: the rest is made on the way
            for params in itertools.islice(self._points(), index, None):
                if self._fingerprint(self._experiment, params) not in covered:
                    yield params

    def _points(self) -> Iterator[dict[str, Any]]:
        return filled(self._space, self._defaults)

    def _extend(self) -> bool:
        """Keep the next chunk of points; False when nothing more will be kept (the space
        ended, or MAX_POINTS are kept)."""
        with self._lock:
            if self._exhausted or len(self._made) >= MAX_POINTS:
                return False
            before = len(self._made)
            for params in itertools.islice(self._source, _CHUNK):
                self._made.append((params, self._fingerprint(self._experiment, params)))
            if len(self._made) - before < _CHUNK:
                self._exhausted = True
            return len(self._made) > before


_grids: OrderedDict[str, Grid] = OrderedDict()
_grids_lock = threading.Lock()


def grid(
    project: str,
    device_kind: str,
    experiment: str,
    space: dict[str, list[Any]],
    defaults: dict[str, Any],
    fingerprint: Fingerprint,
) -> Grid:
    """The kept grid of this project's experiment on this device kind, for this declared space
    (a changed space, or changed defaults, is another grid)."""
    key = json.dumps(
        [project, device_kind, experiment, space, defaults], sort_keys=True, default=repr
    )
    with _grids_lock:
        kept = _grids.get(key)
        if kept is None:
            kept = _grids[key] = Grid(experiment, space, defaults, fingerprint)
            while len(_grids) > MAX_GRIDS:
                _grids.popitem(last=False)
        _grids.move_to_end(key)
        return kept
