"""matplotlib figures as SVG text, the same for the same data: a fixed hash salt, text kept as
text (`svg.fonttype: none`), no date.

matplotlib reads those settings from its process-wide `rcParams` while it writes the SVG, and
`rc_context` sets and restores them globally, not per thread. Two threads writing at once (the
dashboard's request threads, the control worker's step threads) could each restore the other's
settings mid-write and get glyphs drawn as paths, with no text to read. One lock serialises the
writes; drawing the figure stays outside it.
"""

from __future__ import annotations

import io
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_WRITE = threading.Lock()


def new_figure(width: float, height: float) -> Figure:
    """A figure on the Agg canvas (no display needed), not registered with pyplot."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))


def to_svg(figure: Figure, *, tight: bool = True) -> str:
    """The figure as an SVG document, laid out tight unless the caller placed its axes
    (`tight=False`: tight_layout measures every text once more, about half the CPU of a
    two-axes chart)."""
    import matplotlib

    if tight:
        figure.tight_layout()
    buffer = io.StringIO()
    with _WRITE, matplotlib.rc_context({"svg.hashsalt": "autopilot", "svg.fonttype": "none"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    return buffer.getvalue()
