"""The one state-machine primitive (app/statemachine.py): a table of moves checked when it is
built, the one `move` that refuses what the table does not hold (naming the row and both
states, one exception type for every lifecycle), and the racing form a repository writes."""

from __future__ import annotations

import pickle
from enum import StrEnum
from types import SimpleNamespace

import pytest

from app.errors import Conflict
from app.statemachine import IllegalMove, Lifecycle, Move


class Light(StrEnum):
    RED = "red"
    GREEN = "green"
    AMBER = "amber"
    OFF = "off"


LIGHT = Lifecycle(
    "traffic light",
    Light,
    (
        Move((Light.RED,), (Light.GREEN,), "timer", "its red phase is over"),
        Move((Light.GREEN,), (Light.AMBER,), "timer", "its green phase is over"),
        Move((Light.AMBER,), (Light.RED,), "timer", "its amber phase is over"),
        Move((Light.RED, Light.GREEN, Light.AMBER), (Light.OFF,), "keeper", "switched off"),
    ),
    attr="colour",
    final=(Light.OFF,),
)


def light(colour: str | None, light_id: int = 4) -> SimpleNamespace:
    return SimpleNamespace(id=light_id, colour=colour, changed_at=None)


def test_an_illegal_move_names_the_row_both_states_and_where_it_may_go() -> None:
    row = light("red")
    with pytest.raises(IllegalMove) as refused:
        LIGHT.move(row, Light.AMBER, changed_at=1)
    error = refused.value
    assert error.detail == (
        "traffic light 4 cannot move from red to amber: from red it may only become green, off"
    )
    assert isinstance(error, Conflict) and error.status == 409
    assert (error.slug, error.title) == (
        "illegal-traffic-light-move",
        "Traffic light cannot make that move",
    )
    assert error.extra == {"from_state": "red", "to_state": "amber"}
    assert error.problem()["type"].endswith("/illegal-traffic-light-move")
    assert (row.colour, row.changed_at) == ("red", None)  # nothing was set


def test_a_final_state_is_left_by_nothing() -> None:
    with pytest.raises(IllegalMove, match="from off to red: off is final"):
        LIGHT.move(light("off"), Light.RED)


def test_a_state_it_does_not_know_is_refused() -> None:
    with pytest.raises(IllegalMove, match="from blue to red"):
        LIGHT.move(light("blue"), Light.RED)
    with pytest.raises(IllegalMove, match="from red to blue"):
        LIGHT.move(light("red"), "blue")


def test_a_legal_move_sets_the_state_attribute_and_its_fields() -> None:
    row = light("amber")
    LIGHT.move(row, Light.RED, changed_at=2)
    assert (row.colour, row.changed_at) == ("red", 2)
    assert type(row.colour) is str  # the column holds the plain value


def test_the_state_is_the_move_not_a_field() -> None:
    with pytest.raises(TypeError):
        LIGHT.move(light("red"), Light.GREEN, colour="amber")


def test_the_table_answers_what_it_allows() -> None:
    assert LIGHT.allows("red", "green") and not LIGHT.allows("green", "red")
    assert LIGHT.onward("green") == ("amber", "off") and LIGHT.onward("off") == ()
    assert [m.by for m in LIGHT.allowed[("red", "off")]] == ["keeper"]
    assert LIGHT.states == ("red", "green", "amber", "off")


def test_a_blank_column_reads_as_its_blank_state() -> None:
    step = Lifecycle(
        "step",
        ("pending", "kept", "dropped"),
        (Move(("pending",), ("kept", "dropped"), "judge", "decided"),),
        attr="outcome",
        blank="pending",
    )
    row = SimpleNamespace(id=1, outcome=None)
    assert step.state_of(row) == "pending" and step.allows(None, "kept")
    step.move(row, "kept")
    assert row.outcome == "kept"
    with pytest.raises(IllegalMove, match="from kept to dropped"):
        step.move(row, "dropped")


@pytest.mark.parametrize(
    ("moves", "final", "blank", "message"),
    [
        ((Move(("red",), ("blue",), "x", "y"),), (), None, "no state of it: red -> blue"),
        ((Move(("off",), ("red",), "x", "y"),), ("off",), None, "off is final"),
        ((Move(("red",), ("off",), "x", ""),), (), None, "no reason"),
        ((Move(("red",), ("off",), "", "y"),), (), None, "no mover"),
        ((), (), "pending", "blank state"),
    ],
)
def test_a_table_that_does_not_hold_together_is_refused_when_built(
    moves: tuple[Move, ...], final: tuple[str, ...], blank: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Lifecycle("light", Light, moves, final=final, blank=blank)


def test_a_racing_move_is_built_from_the_table() -> None:
    change = LIGHT.guarded((Light.RED, Light.AMBER), Light.OFF)
    assert change.frm == ("red", "amber") and change.assign == {"colour": "off"}
    assert all(type(s) is str for s in (*change.frm, *change.assign.values()))
    with pytest.raises(IllegalMove, match="a traffic light cannot move from green to red"):
        LIGHT.guarded((Light.AMBER, Light.GREEN), Light.RED)


def test_a_refusal_survives_pickling() -> None:
    with pytest.raises(IllegalMove) as refused:
        LIGHT.move(light("off"), Light.RED)
    again = pickle.loads(pickle.dumps(refused.value))  # noqa: S301 - our own object
    assert (again.kind, again.slug, again.detail, again.extra) == (
        "traffic light",
        "illegal-traffic-light-move",
        refused.value.detail,
        {"from_state": "off", "to_state": "red"},
    )
