"""Point and line panels written as SVG text directly, for the harness report's plot (the paired
samples and the thread sweep), which every cycle's commit step makes.

matplotlib drew it in 23-30 ms of CPU, most of it creating tick and text objects, under the
control worker's GIL; this writes the same panels in about a millisecond. The figure keeps the
report's sizes and margins (`report_format`), matplotlib's default colours, at most six ticks an
axis and text as text; the same data gives the same bytes. The command report's box plots and
the dashboard's charts stay with matplotlib.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from xml.sax.saxutils import escape, quoteattr

from app.reports.format import (
    MARGIN_BOTTOM,
    MARGIN_LEFT,
    MARGIN_RIGHT,
    MARGIN_TOP,
    PANEL_GAP,
    PANEL_H,
    PANEL_W,
)

#: matplotlib's default colour cycle ("tab10"), so a series keeps its colour across renderers.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")
PT = 72.0  # SVG user units (points) an inch
FONT = "DejaVu Sans, Bitstream Vera Sans, Arial, sans-serif"
MOST_TICKS = 6
PAD = 0.05  # of the data's range, on each side (matplotlib's default margins)

Style = Literal["points", "line", "dashed"]


@dataclass(frozen=True)
class Series:
    """`points`: markers only; `line`: a line through markers; `dashed`: a grey reference line."""

    name: str
    points: Sequence[tuple[float, float]]
    style: Style = "points"


@dataclass(frozen=True)
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: Sequence[Series]


def render(panels: Sequence[Panel], empty: str = "nothing to plot") -> str:
    """The panels side by side in one SVG document; `empty` alone where there are none."""
    count = max(len(panels), 1)
    width, height = PANEL_W * count * PT, PANEL_H * PT
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}pt" height="{height:.0f}pt"'
        f' viewBox="0 0 {width:.0f} {height:.0f}" font-family={quoteattr(FONT)} font-size="10">',
        f'<rect width="{width:.0f}" height="{height:.0f}" fill="#ffffff"/>',
    ]
    if not panels:
        out.append(_text(width / 2, height / 2, empty, anchor="middle", size=10))
    axes_w = (PANEL_W * count - MARGIN_LEFT - MARGIN_RIGHT - PANEL_GAP * (count - 1)) * PT / count
    axes_h = (PANEL_H - MARGIN_TOP - MARGIN_BOTTOM) * PT
    for index, panel in enumerate(panels):
        left = MARGIN_LEFT * PT + index * (axes_w + PANEL_GAP * PT)
        out += _panel(panel, left, MARGIN_TOP * PT, axes_w, axes_h)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(panel: Panel, left: float, top: float, w: float, h: float) -> list[str]:
    xs = [x for s in panel.series for x, _ in s.points]
    ys = [y for s in panel.series for _, y in s.points]
    (x0, x1, xticks), (y0, y1, yticks) = _axis(xs), _axis(ys)

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * w

    def py(y: float) -> float:
        return top + h - (y - y0) / (y1 - y0) * h

    out = [f'<g class="panel">{_text(left + w / 2, top - 6, panel.title, "middle", 12)}']
    xlabels, ylabels = _labels(xticks), _labels(yticks)
    for value, label in zip(xticks, xlabels, strict=True):
        x = px(value)
        out.append(_line(x, top + h, x, top + h + 3.5))
        out.append(_text(x, top + h + 14, label, "middle"))
    for value, label in zip(yticks, ylabels, strict=True):
        y = py(value)
        out.append(_line(left - 3.5, y, left, y))
        out.append(_text(left - 6, y + 3.5, label, "end"))
    out.append(_text(left + w / 2, top + h + 30, panel.xlabel, "middle"))
    ylabel_x = left - 12 - 6 * max((len(label) for label in ylabels), default=1)
    out.append(
        f'<text x="{ylabel_x:.2f}" y="{top + h / 2:.2f}" text-anchor="middle"'
        f' transform="rotate(-90 {ylabel_x:.2f} {top + h / 2:.2f})">{escape(panel.ylabel)}</text>'
    )
    colours = iter(PALETTE * 4)
    legend: list[tuple[Series, str]] = []
    for series in panel.series:
        colour = "#808080" if series.style == "dashed" else next(colours)
        legend.append((series, colour))
        points = [(px(x), py(y)) for x, y in series.points]
        if series.style != "points":
            path = " ".join(f"{x:.2f},{y:.2f}" for x, y in points)
            dash = ' stroke-dasharray="3.7,1.6"' if series.style == "dashed" else ""
            width = 1 if series.style == "dashed" else 1.5
            out.append(
                f'<polyline points="{path}" fill="none" stroke="{colour}"'
                f' stroke-width="{width}"{dash}/>'
            )
        if series.style != "dashed":
            radius, opacity = (2.0, ' fill-opacity="0.7"') if series.style == "points" else (3, "")
            out += [
                f'<circle cx="{x:.2f}" cy="{y:.2f}" r="{radius}" fill="{colour}"{opacity}/>'
                for x, y in points
            ]
    out.append(
        f'<rect x="{left:.2f}" y="{top:.2f}" width="{w:.2f}" height="{h:.2f}" fill="none"'
        ' stroke="#000000" stroke-width="0.8"/>'
    )
    out += _legend(legend, left, top, w, h, [(px(x), py(y)) for x, y in zip(xs, ys, strict=True)])
    out.append("</g>")
    return out


def _legend(
    entries: list[tuple[Series, str]],
    left: float,
    top: float,
    w: float,
    h: float,
    drawn: list[tuple[float, float]],
) -> list[str]:
    """A legend box in the corner of the axes with the fewest points under it."""
    if not entries:
        return []
    box_w = 34 + 5.2 * max(len(series.name) for series, _ in entries)
    box_h = 6 + 13 * len(entries)
    corners = [
        (left + 6, top + 6),
        (left + w - 6 - box_w, top + 6),
        (left + 6, top + h - 6 - box_h),
        (left + w - 6 - box_w, top + h - 6 - box_h),
    ]

    def covered(corner: tuple[float, float]) -> int:
        x, y = corner
        return sum(x <= px <= x + box_w and y <= py <= y + box_h for px, py in drawn)

    x, y = min(corners, key=covered)  # the first of the emptiest: upper left before the others
    out = [
        f'<rect x="{x:.2f}" y="{y:.2f}" width="{box_w:.2f}" height="{box_h:.2f}" fill="#ffffff"'
        ' fill-opacity="0.8" stroke="#cccccc" stroke-width="0.8" rx="2"/>'
    ]
    for row, (series, colour) in enumerate(entries):
        mid = y + 9.5 + 13 * row
        if series.style == "points":
            out.append(f'<circle cx="{x + 14:.2f}" cy="{mid:.2f}" r="2.5" fill="{colour}"/>')
        else:
            dash = ' stroke-dasharray="3.7,1.6"' if series.style == "dashed" else ""
            out.append(
                f'<line x1="{x + 5:.2f}" y1="{mid:.2f}" x2="{x + 23:.2f}" y2="{mid:.2f}"'
                f' stroke="{colour}" stroke-width="1.5"{dash}/>'
            )
        out.append(_text(x + 28, mid + 3, series.name, "start", 8))
    return out


def _axis(values: Sequence[float]) -> tuple[float, float, list[float]]:
    """An axis's limits (the data's range with 5% either side) and its ticks within them."""
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    if high <= low:
        spread = abs(low) * 0.05 or 0.5
        low, high = low - spread, high + spread
    pad = (high - low) * PAD
    low, high = low - pad, high + pad
    return low, high, ticks(low, high)


def ticks(low: float, high: float, most: int = MOST_TICKS) -> list[float]:
    """At most `most` round values in [low, high], a step of 1, 2, 2.5 or 5 times a power of 10."""
    magnitude = 10 ** math.floor(math.log10((high - low) / most))
    for multiple in (1, 2, 2.5, 5, 10, 20, 25, 50):  # the finest step that fits
        step = multiple * magnitude
        first = math.ceil(low / step - 1e-9) * step
        count = math.floor((high - first) / step + 1e-9) + 1
        if count <= most:
            break
    return [_clean(first + i * step, step) for i in range(count)]


def _clean(value: float, step: float) -> float:
    digits = max(0, 2 - math.floor(math.log10(step)))
    rounded = round(value, digits)
    return 0.0 if rounded == 0 else rounded


def _labels(values: Sequence[float]) -> list[str]:
    """Tick labels with the fewest decimals that tell them apart, large values in k/M/G, and
    matplotlib's minus sign."""
    top = max((abs(v) for v in values), default=0.0)
    scale, suffix = next(
        ((s, u) for s, u in ((1e9, "G"), (1e6, "M"), (1e4, "k")) if top >= s), (1.0, "")
    )
    scaled = [v / scale for v in values]
    formats = [f".{decimals}f" for decimals in range(5)] + [
        f".{digits}g" for digits in range(2, 16)
    ]
    texts = [f"{v:g}" for v in scaled]
    for spec in formats:  # fixed decimals, else significant digits (tiny or offset ranges)
        attempt = [format(v, spec) for v in scaled]
        if len(set(attempt)) == len(attempt):
            texts = attempt
            break
    return [t.replace("-", "\u2212") + suffix for t in texts]


def _line(x1: float, y1: float, x2: float, y2: float) -> str:
    return (
        f'<line x1="{x1:.2f}" y1="{y1:.2f}" x2="{x2:.2f}" y2="{y2:.2f}" stroke="#000000"'
        ' stroke-width="0.8"/>'
    )


def _text(x: float, y: float, text: str, anchor: str, size: float = 10) -> str:
    font = f' font-size="{size:g}"' if size != 10 else ""
    return f'<text x="{x:.2f}" y="{y:.2f}" text-anchor="{anchor}"{font}>{escape(text)}</text>'
