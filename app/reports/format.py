"""How a cycle's report writes what it shows, for the harness and the command renderings alike:
numbers read from a result, Markdown cells and code, and an SVG figure rendered the same twice
(a fixed hash salt, text kept as text, no date)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from app.reports import svg_matplotlib as svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_BACKTICKS = re.compile(r"`+")
#: A report panel's size and the room around its axes, in inches: about what tight_layout gave
#: these figures, with room on the left for the y label and tick labels of nine characters
#: (`−0.000125`; the tick formatter switches to an offset beyond). Fixed margins spare the
#: commit step a layout pass (tight_layout measures every text again: half the plot's CPU).
PANEL_W, PANEL_H = 6.4, 4.8
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_BOTTOM, MARGIN_TOP, PANEL_GAP = 1.15, 0.15, 0.6, 0.4, 1.1
#: A panel's title at the top of its axes, where automatic placement puts it (no panel has tick
#: labels on top): given, it spares matplotlib measuring the top axis at each draw (~15% of the
#: plot's CPU); the SVG is the same byte for byte.
TITLE_Y = 1.0


def number(value: Any) -> float | None:
    """A finite int or float as a float; None for anything else (bools included)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def cell(value: Any) -> str:
    """A Markdown table cell: `–` for nothing, 4 significant digits, no pipe or newline."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _longest_backticks(text: str) -> int:
    return max((len(run) for run in _BACKTICKS.findall(text)), default=0)


def code_span(text: str) -> str:
    """Inline code that the text cannot close early, whatever backticks it holds."""
    text = text.replace("\n", " ")
    fence = "`" * (_longest_backticks(text) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(lines: Sequence[str], info: str = "sh") -> list[str]:
    """A fenced block longer than any backtick run inside, so no line can end it."""
    fence = "`" * max(3, max((_longest_backticks(line) for line in lines), default=0) + 1)
    return [fence + info, *lines, fence]


def render_svg(panels: int, draw: Callable[[Sequence[Axes]], None]) -> str:
    """A figure of `panels` side by side (at least one), drawn by `draw`, as SVG text."""
    count = max(panels, 1)
    width = PANEL_W * count
    figure = svg.new_figure(width, PANEL_H)
    axes_w = (width - MARGIN_LEFT - MARGIN_RIGHT - PANEL_GAP * (count - 1)) / count
    figure.subplots_adjust(
        left=MARGIN_LEFT / width,
        right=1 - MARGIN_RIGHT / width,
        bottom=MARGIN_BOTTOM / PANEL_H,
        top=1 - MARGIN_TOP / PANEL_H,
        wspace=PANEL_GAP / axes_w,
    )
    axes = list(figure.subplots(1, count, squeeze=False)[0])
    for ax in axes:
        # At most 5 ticks an axis (matplotlib's automatic choice gives 8-11 on these panels):
        # plenty to read a ratio, and tick objects are most of a plot's drawing time (a
        # quarter less CPU for the commit step's plot, which every cycle makes). A `draw`
        # that sets another scale or categories gets that axis's own locator.
        ax.locator_params(nbins=5)
    draw(axes)
    return svg.to_svg(figure, tight=False)
