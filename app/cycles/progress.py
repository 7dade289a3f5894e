"""How a project has moved across its cycles: the headline ratio of each cycle in order with the
best result so far, and each experiment's parameter space with what every point was judged.

This module holds the data (pure, unit-tested); `progress_plot.py` draws it. `load` reads a
project's cycles through the cycles service and the declared parameter space from the
`autopilot.toml` of its newest cycle's base commit (in the project's mirror), so the map also
shows the points no cycle has tried yet.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.cycles import service
from app.cycles.models import Cycle
from app.db import Stores
from app.errors import AutopilotError
from app.forge import service as forge_service
from app.git.work import GitWork
from app.projects import service as projects
from app.projects.config import Scalar
from app.reports.format import number
from app.settings import Settings

#: The newest cycles a chart shows; older ones are left out (the chart says how many).
MAX_CYCLES = 500
#: Small multiples beyond this are left out (the map says how many).
MAX_PANELS = 12
IMPROVED = ("faster", "better")
NOT_JUDGED = "not judged"
#: One colour per verdict (the dashboard's badges use the same families): an improvement green,
#: a regression red, no decision grey, failed accuracy purple; a cycle without a verdict is
#: drawn hollow.
VERDICT_COLOURS = {
    "faster": "#1a7f37",
    "better": "#1a7f37",
    "slower": "#cf222e",
    "worse": "#cf222e",
    "inconclusive": "#8c959f",
    "rejected_accuracy": "#8250df",
    NOT_JUDGED: "#ffffff",
}


def colour(verdict: str | None) -> str:
    return VERDICT_COLOURS.get(verdict or NOT_JUDGED, VERDICT_COLOURS[NOT_JUDGED])


@dataclass(frozen=True)
class Point:
    """One cycle as the charts see it."""

    cycle_id: int
    experiment: str | None  # None while the agent has not proposed yet
    parameters: Mapping[str, Any]
    state: str
    verdict: str | None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None

    @classmethod
    def of(cls, cycle: Cycle) -> Point:
        h = cycle.headline or {}
        return cls(
            cycle_id=cycle.id,
            experiment=cycle.experiment,
            parameters=dict(cycle.parameters or {}),
            state=cycle.state,
            verdict=cycle.verdict,
            ratio=number(h.get("ratio")),
            ci_low=number(h.get("ci_low")),
            ci_high=number(h.get("ci_high")),
        )

    @property
    def judged(self) -> str:
        """The verdict, or `not judged` (running, failed, skipped, cancelled)."""
        return self.verdict or NOT_JUDGED

    @property
    def label(self) -> str:
        params = ", ".join(f"{k}={v}" for k, v in sorted(self.parameters.items()))
        ratio = "" if self.ratio is None else f", ratio {self.ratio:.3f}"
        if self.ci_low is not None and self.ci_high is not None:
            ratio += f" [{self.ci_low:.3f}, {self.ci_high:.3f}]"
        what = self.experiment or "no experiment yet"
        return f"cycle {self.cycle_id}: {what} ({params or 'no parameters'}): " + (
            f"{self.judged.replace('_', ' ')}{ratio}"
        )


@dataclass(frozen=True)
class Progress:
    """A project's cycles (oldest first) and what its config declares of each experiment."""

    project: str
    points: list[Point]
    spaces: dict[str, dict[str, list[Scalar]]] = field(default_factory=dict)
    directions: dict[str, str] = field(default_factory=dict)
    left_out: int = 0  # older cycles beyond MAX_CYCLES

    @property
    def experiments(self) -> list[str]:
        """Experiments with cycles, in the order of their first cycle."""
        return list(dict.fromkeys(p.experiment for p in self.points if p.experiment))

    def direction(self, experiment: str) -> str:
        """`lower` or `higher`: which way the ratio improves (from the config, else from the
        judged cycles: an improvement above 1 means higher is better)."""
        if experiment in self.directions:
            return self.directions[experiment]
        for p in self.points:
            if p.experiment == experiment and p.ratio is not None and p.verdict in IMPROVED:
                return "higher" if p.ratio > 1 else "lower"
        return "lower"


# -- the trend ----------------------------------------------------------------------------


def best_records(points: Iterable[Point], direction: str) -> list[Point]:
    """The cycles that each set a new best, in order: a judged improvement (faster or better:
    the whole CI cleared 1 and the noise floor, accuracy passed) whose ratio beats every earlier
    one. An inconclusive ratio is not a result, however low it is."""
    records: list[Point] = []
    for p in points:
        if p.verdict not in IMPROVED or p.ratio is None:
            continue
        if not records or _beats(p.ratio, records[-1].ratio, direction):
            records.append(p)
    return records


def _beats(ratio: float, best: float | None, direction: str) -> bool:
    return best is None or (ratio < best if direction == "lower" else ratio > best)


@dataclass(frozen=True)
class Trend:
    points: list[Point]  # cycles with a ratio, oldest first (x = index)
    records: dict[str, list[Point]]  # per experiment: its best-so-far records
    without_ratio: int

    def x(self, point: Point) -> int:
        return self.points.index(point)

    @property
    def best(self) -> dict[str, Point]:
        """Each experiment's best result so far (its last record)."""
        return {name: records[-1] for name, records in self.records.items() if records}


def trend(progress: Progress) -> Trend:
    with_ratio = [p for p in progress.points if p.ratio is not None]
    records = {
        name: best_records(
            (p for p in with_ratio if p.experiment == name), progress.direction(name)
        )
        for name in progress.experiments
    }
    return Trend(with_ratio, records, len(progress.points) - len(with_ratio))


# -- the parameter map --------------------------------------------------------------------


def value_key(value: Any) -> str:
    """A parameter value's identity: `3` and `3.0` and `true` stay three values."""
    return json.dumps(value, sort_keys=True, default=str)


def _sort_key(value: Any) -> tuple[int, float, str]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, value_key(value))


def ordered_values(declared: Sequence[Any], seen: Iterable[Any]) -> list[Any]:
    """The declared values in their order, then any other value cycles used, sorted."""
    out = list({value_key(v): v for v in declared}.values())
    known = {value_key(v) for v in out}
    extra = {value_key(v): v for v in seen if value_key(v) not in known}
    return out + sorted(extra.values(), key=_sort_key)


@dataclass(frozen=True)
class Axis:
    name: str
    values: list[Any]

    def index(self, value: Any) -> int:
        return [value_key(v) for v in self.values].index(value_key(value))


@dataclass(frozen=True)
class Mark:
    point: Point
    x: float
    y: float


@dataclass(frozen=True)
class Panel:
    fixed: dict[str, Any]  # the values of the parameters beyond the first two
    marks: list[Mark]

    @property
    def title(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.fixed.items())


@dataclass(frozen=True)
class SpaceMap:
    """One experiment's parameter space: a strip (one parameter), a grid (two), small multiples
    of the grid over the values of the rest (more)."""

    experiment: str
    x: Axis
    y: Axis | None
    panels: list[Panel]
    hidden_panels: int = 0


def _dodge(count: int) -> list[float]:
    """Offsets that set `count` cycles at one point side by side, so each keeps its link."""
    if count <= 1:
        return [0.0]
    step = min(0.6 / (count - 1), 0.25)
    return [(i - (count - 1) / 2) * step for i in range(count)]


def space_map(progress: Progress, experiment: str) -> SpaceMap:
    points = [p for p in progress.points if p.experiment == experiment]
    declared = progress.spaces.get(experiment, {})
    names = list(declared) + sorted({k for p in points for k in p.parameters} - set(declared))
    axes = [
        Axis(
            n,
            ordered_values(
                declared.get(n, []), (p.parameters[n] for p in points if n in p.parameters)
            ),
        )
        for n in names
    ]
    x = axes[0] if axes else Axis("(no parameters)", ["–"])
    y = axes[1] if len(axes) > 1 else None
    rest = axes[2:]
    combos = [
        dict(zip([a.name for a in rest], c, strict=True))
        for c in itertools.product(*(a.values for a in rest))
    ]

    def fixed_of(p: Point) -> str:
        return value_key({a.name: p.parameters.get(a.name) for a in rest})

    if len(combos) > MAX_PANELS:  # too many to show all: those with cycles
        tried = {fixed_of(p) for p in points}
        shown = [c for c in combos if value_key(c) in tried]
    else:
        shown = combos
    panels = []
    for fixed in shown[:MAX_PANELS]:
        here = [p for p in points if fixed_of(p) == value_key(fixed)]
        panels.append(Panel(fixed, _marks(here, x, y)))
    hidden = len({fixed_of(p) for p in points} - {value_key(c) for c in shown[:MAX_PANELS]})
    return SpaceMap(experiment, x, y, panels, hidden)


def _marks(points: list[Point], x: Axis, y: Axis | None) -> list[Mark]:
    cells: dict[tuple[int, int], list[Point]] = {}
    for p in points:
        col = x.index(p.parameters[x.name]) if x.name in p.parameters else 0
        row = y.index(p.parameters[y.name]) if y is not None and y.name in p.parameters else 0
        cells.setdefault((col, row), []).append(p)
    return [
        Mark(p, col + offset, row)
        for (col, row), here in sorted(cells.items())
        for p, offset in zip(here, _dodge(len(here)), strict=True)
    ]


# -- reading a project --------------------------------------------------------------------


def load(settings: Settings, stores: Stores, name: str) -> Progress:
    """The project's newest MAX_CYCLES cycles and its declared spaces; ProjectNotFound when no
    project has that name."""
    with stores.ops_session() as session:
        project = projects.get_project(session, name)
        rows, total = service.list_cycles(session, project=name, limit=MAX_CYCLES)
        points = [Point.of(c) for c in reversed(rows)]
        base = next((c.base_sha for c in rows if c.base_sha), None)
        branch = project.default_branch
    spaces, directions = _declared(settings, name, base, branch)
    return Progress(name, points, spaces, directions, max(total - len(points), 0))


def _declared(
    settings: Settings, name: str, base: str | None, branch: str
) -> tuple[dict[str, dict[str, list[Scalar]]], dict[str, str]]:
    """Each experiment's declared parameter space and direction, from `autopilot.toml` at the
    newest cycle's base commit; empty when it cannot be read (the map then shows only the
    points cycles tried)."""
    if base is None:
        return {}, {}
    try:
        config = forge_service.config_at_commit(GitWork(settings), name, base, branch)
    except AutopilotError:
        return {}, {}
    return (
        {e: dict(x.parameters) for e, x in config.experiments.items()},
        {e: x.direction for e, x in config.experiments.items()},
    )
