"""How a cycle's report writes what it shows, for the harness and the command renderings alike:
numbers read from a result, Markdown cells and code, and an SVG figure rendered the same twice
(a fixed hash salt, text kept as text, no date)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from app import svg

if TYPE_CHECKING:
    from matplotlib.axes import Axes

_BACKTICKS = re.compile(r"`+")


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
    figure = svg.new_figure(6.4 * max(panels, 1), 4.8)
    draw(list(figure.subplots(1, max(panels, 1), squeeze=False)[0]))
    return svg.to_svg(figure)
