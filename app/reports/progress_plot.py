"""The charts of a project's progress as SVG: the headline ratio per cycle with its CI and the
best so far, and an experiment's parameter space coloured by verdict. Each cycle's mark links
to its dashboard page.

Drawn with matplotlib's Agg backend as the cycle reports are (`app.reports.format`), then
made fit to sit inline in a dashboard page under its Content-Security-Policy (`style-src
'self'`: no inline styles): matplotlib's `style="…"` attributes become SVG presentation
attributes, its one `<style>` element becomes attributes of the root, links open in the same
tab with an accessible name, and every id gets a prefix so two charts on one page never clash.
The API serves the very same SVG.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from app.cycles.exceptions import NothingToPlot
from app.cycles.progress import (
    NOT_JUDGED,
    VERDICT_COLOURS,
    Point,
    Progress,
    SpaceMap,
    Trend,
    colour,
    load,
    space_map,
    trend,
)
from app.db import Stores
from app.errors import InvalidInput
from app.reports import svg_matplotlib as svg
from app.settings import Settings

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CYCLE_URL = "/dashboard/cycles/{id}"
BEST = "#0969da"
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
# The CSS properties matplotlib writes, all of them SVG presentation attributes too.
PRESENTATION = frozenset(
    {
        "fill",
        "fill-opacity",
        "fill-rule",
        "stroke",
        "stroke-width",
        "stroke-opacity",
        "stroke-linecap",
        "stroke-linejoin",
        "stroke-miterlimit",
        "stroke-dasharray",
        "stroke-dashoffset",
        "opacity",
        "font-family",
        "font-size",
        "font-style",
        "font-weight",
        "font-stretch",
        "font-variant",
        "text-anchor",
        "dominant-baseline",
        "clip-path",
        "visibility",
    }
)
_STYLE = re.compile(r'\sstyle="([^"]*)"')
_STYLE_ELEMENT = re.compile(r"<style[^>]*>(.*?)</style>", re.S)
_LINK = re.compile(r'<a xlink:href="([^"]*)"(?: target="_blank")?>')


def url(point: Point) -> str:
    return CYCLE_URL.format(id=point.cycle_id)


# -- the figures --------------------------------------------------------------------------


def _figure(width: float, height: float, rows: int, cols: int) -> tuple[Figure, list[Axes]]:
    figure = svg.new_figure(width, height)
    axes = list(figure.subplots(rows, cols, squeeze=False).flat)
    return figure, axes


def _verdict_legend(ax: Axes, verdicts: list[str], extra: Sequence[Artist] = ()) -> None:
    from matplotlib.lines import Line2D

    handles = [
        Line2D(
            [],
            [],
            linestyle="none",
            marker="o",
            markerfacecolor=colour(v),
            markeredgecolor="#57606a",
            label=v.replace("_", " "),
        )
        for v in verdicts
    ]
    # Outside the axes, on the right: a legend never hides a point (or its link).
    ax.legend(
        handles=[*handles, *extra],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize="small",
        frameon=False,
    )


def _verdicts(points: list[Point]) -> list[str]:
    """The verdicts present, in the legend's fixed order."""
    present = {p.judged for p in points}
    return [v for v in dict.fromkeys(VERDICT_COLOURS) if v in present]


def trend_svg(progress: Progress, trend: Trend) -> str:
    """The headline ratio of each cycle with its CI, coloured by verdict; a step line per
    experiment through its best result so far, and the best marked with a star."""
    from matplotlib.lines import Line2D

    n = len(trend.points)
    figure, (ax,) = _figure(min(max(7.0, 0.28 * n + 3), 14.0), 4.2, 1, 1)
    experiments = progress.experiments
    shape = {e: MARKERS[i % len(MARKERS)] for i, e in enumerate(experiments)}
    ax.axhline(1.0, color="#57606a", linestyle=":", linewidth=1)
    for experiment in experiments:
        for verdict in _verdicts(trend.points):
            group = [p for p in trend.points if p.experiment == experiment and p.judged == verdict]
            if not group:
                continue
            xs = [trend.x(p) for p in group]
            ys = [p.ratio or 0.0 for p in group]
            with_ci = [p for p in group if p.ci_low is not None and p.ci_high is not None]
            if with_ci:
                ax.errorbar(
                    [trend.x(p) for p in with_ci],
                    [p.ratio or 0.0 for p in with_ci],
                    yerr=[
                        [max((p.ratio or 0) - (p.ci_low or 0), 0) for p in with_ci],
                        [max((p.ci_high or 0) - (p.ratio or 0), 0) for p in with_ci],
                    ],
                    fmt="none",
                    ecolor=colour(verdict) if verdict != NOT_JUDGED else "#8c959f",
                    elinewidth=1.2,
                    capsize=2,
                )
            dots = ax.scatter(
                xs,
                ys,
                s=36,
                marker=shape[experiment],
                c=colour(verdict),
                edgecolors="#57606a",
                linewidths=0.6,
                zorder=3,
            )
            dots.set_urls([url(p) for p in group])
    best_line = None
    for experiment, records in trend.records.items():
        if not records:
            continue
        xs = [trend.x(p) for p in records] + [n - 1]
        ys = [p.ratio or 0.0 for p in records] + [records[-1].ratio or 0.0]
        (best_line,) = ax.step(xs, ys, where="post", color=BEST, linewidth=1.5, zorder=2)
        best = records[-1]
        star = ax.scatter(
            [trend.x(best)],
            [best.ratio or 0.0],
            s=260,
            marker="*",
            facecolors="none",
            edgecolors=BEST,
            linewidths=1.5,
            zorder=4,
        )
        star.set_urls([url(best)])
        ax.annotate(
            f"best {experiment}: cycle {best.cycle_id}, {best.ratio:.3f}",
            (trend.x(best), best.ratio or 0.0),
            textcoords="offset points",
            xytext=(6, 10),
            fontsize="small",
            color=BEST,
        )
    step = max(1, math.ceil(n / 24))
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [str(trend.points[i].cycle_id) for i in ticks])
    ax.set_xlim(-0.7, n - 0.3)
    ax.set_xlabel("cycle, oldest to newest")
    ax.set_ylabel("ratio candidate / baseline, 95% CI")
    ax.set_title("Headline ratio per cycle (1 = no change)")
    ax.grid(axis="y", color="#d0d7de", linewidth=0.5)
    extra: list[Artist] = [
        Line2D([], [], linestyle="none", marker=shape[e], color="#57606a", label=e)
        for e in experiments
        if len(experiments) > 1
    ]
    if best_line is not None:
        extra.append(Line2D([], [], color=BEST, label="best so far"))
    _verdict_legend(ax, _verdicts(trend.points), extra)
    titles = {url(p): p.label for p in trend.points}
    return inline(svg.to_svg(figure), "trend", titles, "Headline ratio per cycle, with best so far")


def space_svg(space: SpaceMap) -> str:
    """The experiment's parameter space: every declared point as a faint dot, each cycle's
    point coloured by its verdict (side by side where several tried one point)."""
    cols = min(len(space.panels), 3) or 1
    rows = max(math.ceil(len(space.panels) / cols), 1)
    nx, ny = len(space.x.values), len(space.y.values) if space.y else 1
    width = cols * max(3.4, 0.75 * nx + 1.8)
    height = rows * max(2.0, 0.5 * ny + 1.6)
    figure, axes = _figure(min(width, 14.0), height, rows, cols)
    all_points = [m.point for panel in space.panels for m in panel.marks]
    for ax, panel in zip(axes, space.panels, strict=False):
        grid = [(i, j) for i in range(nx) for j in range(ny)]
        ax.scatter(
            [i for i, _ in grid], [j for _, j in grid], s=10, c="#d0d7de", marker="o", zorder=1
        )
        for verdict in _verdicts([m.point for m in panel.marks]):
            marks = [m for m in panel.marks if m.point.judged == verdict]
            dots = ax.scatter(
                [m.x for m in marks],
                [m.y for m in marks],
                s=90,
                c=colour(verdict),
                edgecolors="#57606a",
                linewidths=0.8,
                zorder=3,
            )
            dots.set_urls([url(m.point) for m in marks])
        ax.set_xticks(range(nx), [str(v) for v in space.x.values])
        ax.set_xlim(-0.6, nx - 0.4)
        ax.set_xlabel(space.x.name)
        if space.y is not None:
            ax.set_yticks(range(ny), [str(v) for v in space.y.values])
            ax.set_ylabel(space.y.name)
        else:
            ax.set_yticks([])
        ax.set_ylim(-0.6, ny - 0.4)
        if panel.title:
            ax.set_title(panel.title, fontsize="medium")
    for ax in axes[len(space.panels) :]:
        ax.set_axis_off()
    _verdict_legend(axes[cols - 1], _verdicts(all_points))
    title = f"Parameter space of {space.experiment}"
    if space.hidden_panels:
        title += f" ({space.hidden_panels} more combinations with cycles not shown)"
    figure.suptitle(title)
    titles = {url(p): p.label for p in all_points}
    return inline(svg.to_svg(figure), f"space-{space.experiment}", titles, title)


# -- fit for a page -----------------------------------------------------------------------


def _attributes(style: str) -> str:
    """`fill: #fff; stroke-width: 0.8` as ` fill="#fff" stroke-width="0.8"` (properties that are
    not presentation attributes are dropped)."""
    out = []
    for declaration in style.split(";"):
        name, _, value = declaration.partition(":")
        name, value = name.strip(), value.strip()
        if name in PRESENTATION and value:
            out.append(f' {name}="{value}"')
    return "".join(out)


def inline(svg: str, prefix: str, titles: Mapping[str, str], title: str) -> str:
    """matplotlib's SVG document as an `<svg>` element that needs no inline style, links to the
    cycle pages in the same tab (named by `titles`), and has ids starting with `prefix`."""
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", prefix)
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    root_style = _STYLE_ELEMENT.search(svg)
    root = ""
    if root_style is not None:  # `*{stroke-linejoin: round; ...}`: inherited from the root
        root = _attributes(root_style.group(1).strip().lstrip("*").strip("{} "))
        svg = re.sub(r"<defs>\s*</defs>\s*", "", _STYLE_ELEMENT.sub("", svg))
    svg = _STYLE.sub(lambda m: _attributes(m.group(1)), svg)
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}-{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}-{m.group(1)})", svg)
    svg = re.sub(r'xlink:href="#([^"]+)"', lambda m: f'xlink:href="#{prefix}-{m.group(1)}"', svg)

    def link(match: re.Match[str]) -> str:
        target = html.unescape(match.group(1))
        name = html.escape(titles.get(target, target))
        return f'<a href="{html.escape(target)}" aria-label="{name}"><title>{name}</title>'

    svg = _LINK.sub(link, svg)
    label = html.escape(title)
    # The root's start tag is the first `>`: the chart's name goes right after it.
    return svg.replace("<svg ", f'<svg class="chart" aria-label="{label}"{root} ', 1).replace(
        ">", f"><title>{label}</title>", 1
    )


def document(svg: str) -> str:
    """The inline SVG as a standalone document (what the API serves)."""
    return '<?xml version="1.0" encoding="utf-8"?>\n' + svg


def plot(settings: Settings, stores: Stores, name: str, kind: str, experiment: str | None) -> str:
    """The project's trend chart, or one experiment's parameter map, as an SVG element.
    ProjectNotFound for an unknown project; NothingToPlot when it has no cycle to show (or no
    such experiment); InvalidInput when a map needs the experiment named."""
    progress = load(settings, stores, name)
    if not progress.points:
        raise NothingToPlot(
            f"project {name!r} has no cycles yet; start one with POST /api/v1/cycles"
        )
    if kind == "trend":
        chart = trend(progress)
        if not chart.points:
            raise NothingToPlot(
                f"no cycle of project {name!r} has a headline ratio yet "
                f"({len(progress.points)} without one: running, failed or skipped)"
            )
        return trend_svg(progress, chart)
    known = progress.experiments
    if not known:
        raise NothingToPlot(
            f"project {name!r} has no cycle with an experiment yet (planned, or failed before "
            "its plan): nothing to map"
        )
    if experiment is None:
        if len(known) > 1:
            raise InvalidInput(
                f"experiment: project {name!r} has cycles of {', '.join(known)}; name one",
                field="experiment",
            )
        experiment = known[0]
    if experiment not in known:
        raise NothingToPlot(
            f"project {name!r} has no cycle of experiment {experiment!r}; "
            f"its experiments with cycles: {', '.join(known)}"
        )
    return space_svg(space_map(progress, experiment))
