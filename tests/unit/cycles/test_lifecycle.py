"""A cycle's lifecycle (app/cycles/lifecycle.py): the table of moves is each step's declared
FROM_STATES x TO_STATES plus the moves made outside the steps, and `move` refuses the rest."""

from __future__ import annotations

from itertools import product

import pytest

from app.cycles import lifecycle
from app.cycles.lifecycle import ALLOWED, MOVES
from app.cycles.models import Cycle
from app.cycles.states import ALL, LIVE, TERMINAL, WAITING
from app.cycles.steps import STEPS
from app.statemachine import IllegalMove


def cycle(state: str, cycle_id: int = 3) -> Cycle:
    return Cycle(id=cycle_id, project_id=1, state=state)


def test_an_illegal_move_is_refused_naming_the_cycle_and_both_states() -> None:
    row = cycle("approved")
    with pytest.raises(IllegalMove) as refused:
        lifecycle.move(row, "planned")
    detail = refused.value.detail
    assert "cycle 3" in detail and "approved" in detail and "planned" in detail
    assert refused.value.status == 409 and refused.value.slug == "illegal-cycle-move"
    assert row.state == "approved" and row.updated_at is None  # nothing was set


def test_a_legal_move_sets_the_state_its_time_and_its_error() -> None:
    row = cycle("planned")
    lifecycle.move(row, "deferred_budget", error="over budget")
    assert (row.state, row.error) == ("deferred_budget", "over budget")
    assert row.updated_at is not None
    lifecycle.move(row, "planned")
    assert (row.state, row.error) == ("planned", "over budget")  # no error given: kept


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        ("approved", "planned"),
        ("cancelled", "preparing"),  # a step whose cycle was cancelled under it
        ("cancelled", "failed"),
        ("awaiting_review", "failed"),
        ("planned", "queued"),  # no step skips another
        ("running", "running"),
        ("rejected", "approved"),
    ],
)
def test_moves_the_table_does_not_hold_are_refused(frm: str, to: str) -> None:
    with pytest.raises(IllegalMove, match=f"from {frm} to {to}"):
        lifecycle.move(cycle(frm), to)


def test_each_steps_moves_are_its_declared_from_and_to_states() -> None:
    for step in STEPS:
        declared = {(f, t) for f, t in product(step.FROM_STATES, step.TO_STATES) if f != t}
        listed = {(f, t) for m in MOVES if m.by == step.__name__ for f, t in product(m.frm, m.to)}
        assert listed == declared, step.__name__
        assert declared <= set(ALLOWED)


def test_the_moves_outside_the_steps() -> None:
    for state in LIVE:
        assert lifecycle.allows(state, "failed")  # the machine, on an error
    for state in (*LIVE, *WAITING):
        assert lifecycle.allows(state, "cancelled")  # a person
    assert lifecycle.allows("awaiting_review", "approved")
    assert lifecycle.allows("awaiting_review", "rejected")
    assert lifecycle.allows("deferred_budget", "planned")


def test_nothing_leaves_an_end_and_every_state_is_reached() -> None:
    assert not [pair for pair in ALLOWED if pair[0] in TERMINAL]
    assert {to for _, to in ALLOWED} | {"planned"} == set(ALL)
    assert all(move.why for move in MOVES)
