"""The informed sweep's order (`[agent] order = "informed"`): memory in the loop without a model.

The points of an experiment's declared space are ordered by what reviewers have judged
(`Context.judged`, the project's validated and refuted verdicts with their parameters):

1. points nearer to a validated win (`faster`/`better`) first, nearest first;
2. then points no judgement is near (equally far from every judged point: the grid's order);
3. points inside a refuted region last: those whose nearest judged point is a loss (a refuted
   finding, or a validated `slower`/`worse`/`rejected_accuracy`) rather than a win.

Distance counts steps along each parameter's declared list of values (each parameter scaled to
[0, 1]), summed over the parameters: a point one value away in one parameter is near.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

WINS = ("faster", "better")
LOSSES = ("slower", "worse", "rejected_accuracy")


def _index(values: Sequence[Any], value: Any) -> int | None:
    try:
        return list(values).index(value)
    except ValueError:
        return None


def distance(
    space: Mapping[str, Sequence[Any]], a: Mapping[str, Any], b: Mapping[str, Any]
) -> float:
    """Steps apart along the declared lists, each parameter scaled to [0, 1]; a value outside the
    space (a finding from an older config) counts as the whole range."""
    total = 0.0
    for key, values in space.items():
        ia, ib = _index(values, a.get(key)), _index(values, b.get(key))
        if ia is None or ib is None:
            total += 1.0
        elif len(values) > 1:
            total += abs(ia - ib) / (len(values) - 1)
    return total


def _outcome(point: Mapping[str, Any]) -> str | None:
    if point.get("status") == "refuted":
        return "loss"
    verdict = point.get("verdict")
    if verdict in WINS:
        return "win"
    if verdict in LOSSES:
        return "loss"
    return None  # inconclusive: says nothing about the region


#: The most points the informed order ranks; beyond, the rest follow in the grid's order.
MAX_RANKED = 100_000


def order(
    experiment: str,
    space: Mapping[str, Sequence[Any]],
    points: Iterable[dict[str, Any]],
    judged: Iterable[Mapping[str, Any]],
) -> Iterator[dict[str, Any]]:
    """`points` (full parameter dicts of `experiment`) in the informed order; stable, so ties
    keep the grid's order. A space larger than MAX_RANKED has its first MAX_RANKED points
    ranked and the rest after them, so memory stays bounded."""
    marks = [
        (_outcome(j), dict(j.get("parameters") or {}))
        for j in judged
        if j.get("experiment") == experiment and _outcome(j) is not None
    ]

    def key(point: dict[str, Any]) -> tuple[int, float]:
        if not marks:
            return (1, 0.0)
        nearest = min(marks, key=lambda m: distance(space, point, m[1]))
        near = distance(space, point, nearest[1])
        if nearest[0] == "win":
            return (0, near)
        return (2, -near)  # inside a refuted region: the farthest from the loss comes first

    walk = iter(points)
    yield from sorted(itertools.islice(walk, MAX_RANKED), key=key)
    yield from walk
