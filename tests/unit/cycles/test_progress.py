"""A project's progress as data and as SVG: best so far, verdict colours, the grid layout, and
the inline SVG a page with a strict Content-Security-Policy can hold."""

from __future__ import annotations

import re
from typing import Any
from xml.etree import ElementTree

from app.cycles.progress import (
    MAX_PANELS,
    NOT_JUDGED,
    Point,
    Progress,
    best_records,
    colour,
    ordered_values,
    space_map,
    trend,
)
from app.reports import progress_plot


def point(
    cycle_id: int,
    verdict: str | None,
    ratio: float | None,
    experiment: str = "probe",
    **parameters: Any,
) -> Point:
    ci = (None, None) if ratio is None else (ratio - 0.02, ratio + 0.02)
    state = "awaiting_review" if verdict else "failed"
    return Point(cycle_id, experiment, parameters, state, verdict, ratio, *ci)


def test_best_so_far_counts_only_judged_improvements_and_each_new_record() -> None:
    points = [
        point(1, "inconclusive", 0.70),  # lowest of all, but no decision: not a result
        point(2, "faster", 0.95),
        point(3, "slower", 1.20),
        point(4, "faster", 0.97),  # an improvement, not a record
        point(5, "rejected_accuracy", 0.50),  # fast and wrong
        point(6, "faster", 0.90),
        point(7, None, None),
    ]
    assert [p.cycle_id for p in best_records(points, "lower")] == [2, 6]
    chart = trend(Progress("p", points))
    assert [p.cycle_id for p in chart.points] == [1, 2, 3, 4, 5, 6]  # with a ratio, in order
    assert chart.without_ratio == 1
    assert chart.best["probe"].cycle_id == 6


def test_best_so_far_follows_the_direction_of_a_higher_is_better_metric() -> None:
    points = [point(1, "better", 1.10), point(2, "better", 1.05), point(3, "better", 1.30)]
    assert [p.cycle_id for p in best_records(points, "higher")] == [1, 3]
    # Without the config, the direction is read from the judged cycles: better above 1.
    assert Progress("p", points).direction("probe") == "higher"
    assert Progress("p", points, directions={"probe": "lower"}).direction("probe") == "lower"
    assert trend(Progress("p", points)).best["probe"].cycle_id == 3


def test_best_so_far_is_kept_per_experiment() -> None:
    points = [point(1, "faster", 0.9, "a"), point(2, "faster", 0.95, "b")]
    best = trend(Progress("p", points)).best
    assert {name: p.cycle_id for name, p in best.items()} == {"a": 1, "b": 2}


def test_verdict_colours_group_improvements_regressions_and_the_rest() -> None:
    assert colour("faster") == colour("better") != colour("slower")
    assert colour("slower") == colour("worse")
    assert len({colour(v) for v in ("faster", "slower", "inconclusive", "rejected_accuracy")}) == 4
    assert colour(None) == colour(NOT_JUDGED) == colour("some-new-verdict") == "#ffffff"


def test_values_keep_the_declared_order_then_the_others_sorted() -> None:
    assert ordered_values([64, 16, 32], [16, 8, 128]) == [64, 16, 32, 8, 128]
    assert ordered_values([], ["fp16", 2, 1.5, True]) == [1.5, 2, "fp16", True]
    assert ordered_values([3], [3.0]) == [3, 3.0]  # two values, as JSON tells them apart


def test_two_parameters_make_one_grid_with_the_declared_points() -> None:
    space = {"block": [16, 32, 64], "unroll": [1, 2]}
    points = [
        point(1, "faster", 0.9, block=32, unroll=2),
        point(2, "slower", 1.1, block=16, unroll=1),
        point(3, "inconclusive", 1.0, block=32, unroll=2),  # the same point again
    ]
    m = space_map(Progress("p", points, {"probe": space}), "probe")
    assert (m.x.name, m.x.values) == ("block", [16, 32, 64])
    assert m.y is not None and (m.y.name, m.y.values) == ("unroll", [1, 2])
    (panel,) = m.panels
    assert panel.title == ""
    where = {mark.point.cycle_id: (mark.x, mark.y) for mark in panel.marks}
    assert where[2] == (0, 0)
    # Two cycles at one point sit side by side around it, each keeping its own mark.
    assert where[1][1] == where[3][1] == 1 and where[1][0] < 1 < where[3][0]


def test_one_parameter_is_a_strip_and_none_a_single_cell() -> None:
    strip = space_map(
        Progress("p", [point(1, "faster", 0.9, n=4), point(2, "slower", 1.2, n=8)]), "probe"
    )
    assert strip.y is None and strip.x.values == [4, 8]
    assert {(m.x, m.y) for m in strip.panels[0].marks} == {(0, 0), (1, 0)}
    bare = space_map(Progress("p", [point(1, "faster", 0.9)]), "probe")
    assert bare.y is None and bare.x.values == ["–"] and len(bare.panels[0].marks) == 1


def test_more_parameters_make_small_multiples_over_the_first_two() -> None:
    space = {"a": [1, 2], "b": [1, 2], "dtype": ["fp16", "fp32"], "warps": [4, 8]}
    points = [point(1, "faster", 0.9, a=1, b=2, dtype="fp32", warps=8)]
    m = space_map(Progress("p", points, {"probe": space}), "probe")
    assert (m.x.name, m.y and m.y.name) == ("a", "b")
    assert [p.title for p in m.panels] == [
        "dtype=fp16, warps=4",
        "dtype=fp16, warps=8",
        "dtype=fp32, warps=4",
        "dtype=fp32, warps=8",
    ]
    assert [len(p.marks) for p in m.panels] == [0, 0, 0, 1]


def test_too_many_combinations_show_only_those_with_cycles_and_count_the_rest() -> None:
    space = {"a": [1], "b": [1], "c": list(range(MAX_PANELS + 8))}
    points = [point(i + 1, "faster", 0.9, a=1, b=1, c=i) for i in range(MAX_PANELS + 3)]
    m = space_map(Progress("p", points, {"probe": space}), "probe")
    assert len(m.panels) == MAX_PANELS and m.hidden_panels == 3
    assert all(len(p.marks) == 1 for p in m.panels)


def _parsed(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(progress_plot.document(svg).encode())


def test_the_charts_are_inline_svg_without_style_each_point_a_link_to_its_cycle() -> None:
    points = [
        point(i, v, r, block=b, unroll=u)
        for i, (v, r, b, u) in enumerate(
            [("faster", 0.9, 16, 1), ("slower", 1.2, 32, 1), (None, None, 16, 2)], start=1
        )
    ]
    found = Progress("p", points, {"probe": {"block": [16, 32], "unroll": [1, 2]}})
    for svg in (
        progress_plot.trend_svg(found, trend(found)),
        progress_plot.space_svg(space_map(found, "probe")),
    ):
        assert svg.startswith("<svg ") and 'class="chart"' in svg
        # The page's CSP allows no inline style: no style attribute, no <style> element.
        assert " style=" not in svg and "<style" not in svg
        assert 'target="_blank"' not in svg
        root = _parsed(svg)  # still well-formed XML
        ids = [e.get("id") for e in root.iter() if e.get("id")]
        assert ids and len(ids) == len(set(ids))
        assert all(i.startswith(("trend-", "space-probe-")) for i in ids)
    trend_links = set(
        re.findall(r'<a href="([^"]+)"', progress_plot.trend_svg(found, trend(found)))
    )
    assert trend_links == {"/dashboard/cycles/1", "/dashboard/cycles/2"}  # cycle 3 has no ratio
    space = progress_plot.space_svg(space_map(found, "probe"))
    assert set(re.findall(r'<a href="([^"]+)"', space)) == {
        f"/dashboard/cycles/{i}" for i in (1, 2, 3)
    }
    assert (
        'aria-label="cycle 2: probe (block=32, unroll=1): slower, ratio 1.200 [1.180, 1.220]"'
        in space
    )
    assert "<title>cycle 3: probe (block=16, unroll=2): not judged</title>" in space


def test_text_in_a_chart_is_escaped() -> None:
    evil = point(1, "faster", 0.9, mode="</svg><script>alert(1)</script>")
    svg = progress_plot.space_svg(space_map(Progress("p", [evil]), "probe"))
    assert "<script" not in svg and "&lt;script&gt;" in svg
    _parsed(svg)


def test_a_cycle_not_yet_proposed_has_no_map_and_no_place_on_the_trend() -> None:
    planned = Point(2, None, {}, "planned", None)
    found = Progress("p", [point(1, "faster", 0.9, n=1), planned])
    assert found.experiments == ["probe"]
    assert trend(found).without_ratio == 1
    assert "no experiment yet" in planned.label
