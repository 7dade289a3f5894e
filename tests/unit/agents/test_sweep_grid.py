"""The sweep's kept grid (app/agents/grid.py): the same proposals as a walk that fingerprints
every point, with each point's fingerprint made once a process, what is kept bounded, and a
point whose cycle let it go proposed again."""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

import pytest

from app.agents import grid
from app.agents.service import Context, SweepAgent
from app.projects.config import parse

TOML = """
[project]
name = "grid"
[experiments.e]
entry = "pkg.bench"
[experiments.e.parameters]
n = [1, 2, 3, 4, 5, 6]
mode = ["a", "b", "c"]
[experiments.e.defaults]
n = 1
mode = "a"
"""


@pytest.fixture(autouse=True)
def fresh_grids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grid, "_grids", OrderedDict())


class Fingerprints:
    """A fingerprint function that counts the points it was asked for."""

    def __init__(self) -> None:
        self.made: list[dict[str, Any]] = []

    def __call__(self, experiment: str, parameters: dict[str, Any]) -> str:
        self.made.append(dict(parameters))
        return of(experiment, parameters)


def of(experiment: str, parameters: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([experiment, parameters], sort_keys=True).encode()).hexdigest()


def every_point() -> list[dict[str, Any]]:
    return [{"n": n, "mode": mode} for n in (1, 2, 3, 4, 5, 6) for mode in ("a", "b", "c")]


def context(covered: set[str], fingerprints: Fingerprints | None) -> Context:
    """What `agent_context` builds: `is_covered` answers for the fingerprints in `covered`."""
    return Context(
        "grid",
        "cpu",
        parse(TOML),
        is_covered=lambda e, p: of(e, p) in covered,
        covered=frozenset(covered),
        fingerprint=fingerprints,
    )


@pytest.mark.parametrize("taken", [0, 1, 5, 17])
def test_the_kept_grid_proposes_what_the_plain_walk_proposes(taken: int) -> None:
    covered = {of("e", p) for p in every_point()[:taken]}
    plain = SweepAgent().propose(context(covered, None))
    kept = SweepAgent().propose(context(covered, Fingerprints()))
    assert plain is not None and kept is not None
    assert kept.parameters == plain.parameters == every_point()[taken]
    assert kept.hypothesis == plain.hypothesis


def test_each_point_is_fingerprinted_once_across_plans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grid, "_CHUNK", 4)
    fingerprints = Fingerprints()
    covered: set[str] = set()
    proposed = []
    for _ in range(10):  # each plan's cycle then holds its point, as a live cycle does
        proposal = SweepAgent().propose(context(covered, fingerprints))
        assert proposal is not None
        proposed.append(proposal.parameters)
        covered.add(of("e", proposal.parameters))
    assert proposed == every_point()[:10]
    assert fingerprints.made == every_point()[:12]  # three chunks of four, made once each


def test_a_point_let_go_is_proposed_again() -> None:
    fingerprints = Fingerprints()
    points = every_point()
    covered = {of("e", p) for p in points[:4]}
    assert SweepAgent().propose(context(covered, fingerprints)).parameters == points[4]  # type: ignore[union-attr]
    covered.discard(of("e", points[1]))  # its cycle failed: the point is free again
    assert SweepAgent().propose(context(covered, fingerprints)).parameters == points[1]  # type: ignore[union-attr]


def test_a_proposal_is_the_callers_own_copy() -> None:
    fingerprints = Fingerprints()
    first = SweepAgent().propose(context(set(), fingerprints))
    assert first is not None
    first.parameters["n"] = 99
    again = SweepAgent().propose(context(set(), fingerprints))
    assert again is not None and again.parameters == every_point()[0]


def test_past_what_is_kept_the_walk_goes_on_and_ends_with_the_space(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(grid, "_CHUNK", 4)
    monkeypatch.setattr(grid, "MAX_POINTS", 8)
    fingerprints = Fingerprints()
    points = every_point()
    covered = {of("e", p) for p in points[:15]}
    assert SweepAgent().propose(context(covered, fingerprints)).parameters == points[15]  # type: ignore[union-attr]
    everything = {of("e", p) for p in points}
    assert SweepAgent().propose(context(everything, fingerprints)) is None
    kept = grid.grid("grid", "cpu", "e", parse(TOML).experiment("e").parameters, {}, fingerprints)
    assert kept is not None and len(grid._grids) == 2  # other defaults: another grid


def test_walks_from_several_threads_see_the_same_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grid, "_CHUNK", 2)
    fingerprints = Fingerprints()
    space = parse(TOML).experiment("e")
    kept = grid.grid("grid", "cpu", "e", space.parameters, space.defaults, fingerprints)
    seen: list[list[dict[str, Any]]] = []
    threads = [
        threading.Thread(target=lambda: seen.append(list(kept.uncovered(frozenset()))))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [every_point()] * 4
    assert len(fingerprints.made) == len(every_point())
