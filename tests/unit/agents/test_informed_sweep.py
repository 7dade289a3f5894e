"""The informed sweep: points near validated wins first, points inside a refuted region last
(app/agents/informed.py), and the sweep agent taking that order."""

from __future__ import annotations

from typing import Any

from app.agents import informed
from app.agents.grid import points
from app.agents.service import Context, SweepAgent
from app.projects.config import parse

SPACE = {"n": [1, 2, 3, 4, 5, 6, 7, 8]}


def grid() -> list[dict[str, Any]]:
    return [dict(p) for p in points(SPACE)]


def judged(
    n: int, verdict: str, status: str = "validated", experiment: str = "e"
) -> dict[str, Any]:
    return {"experiment": experiment, "parameters": {"n": n}, "verdict": verdict, "status": status}


def ns(ordered: list[dict[str, Any]]) -> list[int]:
    return [p["n"] for p in ordered]


def test_without_judgements_the_grid_order_stands() -> None:
    assert ns(informed.order("e", SPACE, grid(), [])) == [1, 2, 3, 4, 5, 6, 7, 8]
    # another experiment's findings say nothing about this one
    other = [judged(8, "faster", experiment="other")]
    assert ns(informed.order("e", SPACE, grid(), other)) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_near_a_win_first_and_inside_a_refuted_region_last() -> None:
    marks = [judged(7, "faster"), judged(2, "slower", status="refuted")]
    order = ns(informed.order("e", SPACE, grid(), marks))
    assert order[:3] == [7, 6, 8]  # the win's neighbourhood, nearest first
    assert order[-1] == 2 and set(order[-3:-1]) == {1, 3}  # the refuted region, its point last
    # an inconclusive verdict marks no region
    assert ns(informed.order("e", SPACE, grid(), [judged(4, "inconclusive")])) == list(range(1, 9))


def test_a_validated_slowdown_is_a_loss_and_a_refuted_speedup_too() -> None:
    order = ns(
        informed.order("e", SPACE, grid(), [judged(1, "slower"), judged(8, "faster", "refuted")])
    )
    assert order[0] in (4, 5) and set(order[-2:]) == {1, 8}


def test_the_sweep_agent_takes_the_informed_order() -> None:
    toml = """
[project]
name = "p"
[experiments.e]
entry = "m.main"
[experiments.e.parameters]
n = [1, 2, 3, 4, 5, 6, 7, 8]
[experiments.e.defaults]
n = 1
[agent]
order = "{order}"
"""
    marks = [judged(6, "faster")]
    covered = {6}

    def context(order: str) -> Context:
        return Context(
            "p",
            "cpu",
            parse(toml.format(order=order)),
            judged=marks,
            is_covered=lambda _e, params: params["n"] in covered,
        )

    informed_pick = SweepAgent().propose(context("informed"))
    grid_pick = SweepAgent().propose(context("grid"))
    assert informed_pick is not None and grid_pick is not None
    assert informed_pick.parameters == {"n": 5}  # next to the win (6 itself is judged)
    assert grid_pick.parameters == {"n": 1}
