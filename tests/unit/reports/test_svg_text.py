"""The report's SVG panels written directly: well-formed, the same bytes for the same data, its
text escaped, and axes whose ticks are few, round, inside the limits and told apart."""

from __future__ import annotations

import math
from xml.etree import ElementTree

from hypothesis import given
from hypothesis import strategies as st

from app.reports import svg_text as svg_chart
from app.reports.svg_text import Panel, Series

SVG = "{http://www.w3.org/2000/svg}"


def _panel(name: str = "fused") -> Panel:
    points = [(1.0 + i / 10, 0.9 + i / 20) for i in range(12)]
    return Panel(
        "Paired <samples> & more",
        "baseline (µs)",
        "variant (µs)",
        [Series(name, points), Series("equal time", [(1.0, 1.0), (2.1, 2.1)], "dashed")],
    )


def test_panels_are_well_formed_and_the_same_twice() -> None:
    sweep = Panel(
        "Thread sweep", "threads", "calls/s", [Series("b", [(1, 1e6), (2, 1.6e6)], "line")]
    )
    text = svg_chart.render([_panel("a<b>&c"), sweep])
    root = ElementTree.fromstring(text)
    words = [t.text for t in root.iter(f"{SVG}text")]
    assert "Paired <samples> & more" in words and "a<b>&c" in words and "1.6M" in words
    # the points, the sweep's markers, the points' legend key (a line's key is a line)
    assert len(list(root.iter(f"{SVG}circle"))) == 12 + 2 + 1
    assert svg_chart.render([_panel("a<b>&c"), sweep]) == text


def test_nothing_to_plot_says_so() -> None:
    root = ElementTree.fromstring(svg_chart.render([], empty="no samples here"))
    assert [t.text for t in root.iter(f"{SVG}text")] == ["no samples here"]


@given(
    st.floats(-1e12, 1e12, allow_nan=False, allow_infinity=False),
    st.floats(1e-9, 1e12, allow_nan=False, allow_infinity=False),
)
def test_ticks_are_few_round_and_inside(low: float, span: float) -> None:
    high = low + span
    if span < abs(low) * 1e-6:  # a range a chart never has: floats cannot tell its ticks apart
        return
    ticks = svg_chart.ticks(low, high)
    assert 2 <= len(ticks) <= svg_chart.MOST_TICKS
    tolerance = span * 1e-6
    assert all(low - tolerance <= t <= high + tolerance for t in ticks)
    step = ticks[1] - ticks[0]
    assert all(
        math.isclose(b - a, step, rel_tol=1e-3) for a, b in zip(ticks, ticks[1:], strict=False)
    )
    mantissa = step / 10 ** math.floor(math.log10(step * (1 + 1e-9)))
    assert any(math.isclose(mantissa, m, rel_tol=1e-3) for m in (1, 2, 2.5, 5, 10))
    labels = svg_chart._labels(ticks)
    assert len(set(labels)) == len(labels)
