"""GPU time per decision, for a project's page: each judged cycle's GPU seconds by the time its
job finished, as a chart and a table. Blocks that stop once a comparison is decided
(docs/design.md, "Sequential verdicts") should make each decision cheaper; this is where a lab
sees whether they do.

A decision is a cycle with a verdict; its GPU seconds are the cycle's record of what its job
used (`Cycle.gpu_seconds`, copied from the job when it ended) and its time is the job's finish.
The chart is drawn by the reports' own SVG writer (`app.reports.svg_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from statistics import median

from markupsafe import Markup
from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.cycles import service as cycles
from app.cycles.progress import MAX_CYCLES
from app.jobs import service as jobs
from app.reports import svg_text
from app.reports.format import number

# The x axis's unit: the largest that the span between the first and last decision fills twice.
UNITS = ((86_400.0, "days"), (3_600.0, "hours"), (60.0, "minutes"))


@dataclass(frozen=True)
class Decision:
    cycle_id: int
    experiment: str | None
    verdict: str
    finished_at: datetime  # when its job finished (aware, UTC)
    gpu_seconds: float
    blocks: int | None = None  # blocks run, where a stopping rule stopped them
    max_blocks: int | None = None


@dataclass(frozen=True)
class Spend:
    decisions: list[Decision]  # oldest first

    @property
    def total(self) -> float:
        return sum(d.gpu_seconds for d in self.decisions)

    @property
    def median(self) -> float:
        return median(d.gpu_seconds for d in self.decisions) if self.decisions else 0.0

    def chart(self) -> Markup | None:
        """The decisions' GPU seconds over time, one series per experiment; None without any."""
        if not self.decisions:
            return None
        return _svg(self.decisions)


def spend(session: Session, project: str) -> Spend:
    """The judged cycles among the project's newest MAX_CYCLES whose job has finished."""
    rows, _ = cycles.list_cycles(session, project=project, limit=MAX_CYCLES)
    judged = [c for c in rows if c.verdict]
    ended = dict(jobs.cycles_whose_job_ended(session, [c.id for c in judged], utcnow()))
    made = []
    for cycle in judged:
        finished = aware(ended.get(cycle.id))
        if finished is None:
            continue
        stopped = (cycle.headline or {}).get("stopped")
        stopped = stopped if isinstance(stopped, dict) else {}
        blocks, most = number(stopped.get("blocks")), number(stopped.get("max_blocks"))
        made.append(
            Decision(
                cycle_id=cycle.id,
                experiment=cycle.experiment,
                verdict=str(cycle.verdict),
                finished_at=finished,
                gpu_seconds=float(cycle.gpu_seconds or 0.0),
                blocks=None if blocks is None else int(blocks),
                max_blocks=None if most is None else int(most),
            )
        )
    return Spend(sorted(made, key=lambda d: (d.finished_at, d.cycle_id)))


def _svg(decisions: Sequence[Decision]) -> Markup:
    first = decisions[0].finished_at
    span = (decisions[-1].finished_at - first).total_seconds()
    scale, unit = next(((s, u) for s, u in UNITS if span >= 2 * s), UNITS[-1])
    series: dict[str, list[tuple[float, float]]] = {}
    for d in decisions:
        x = (d.finished_at - first).total_seconds() / scale
        series.setdefault(d.experiment or "no experiment", []).append((x, d.gpu_seconds))
    panel = svg_text.Panel(
        "GPU time per decision",
        f"{unit} since the first decision ({first:%Y-%m-%d %H:%M} UTC)",
        "GPU time of the cycle's job (s)",
        [svg_text.Series(name, points, "line") for name, points in series.items()],
    )
    # svg_text escapes every text it writes and draws no script and no inline style.
    return Markup(svg_text.render([panel]))  # noqa: S704
