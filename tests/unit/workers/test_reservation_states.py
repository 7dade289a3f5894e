"""A GPU worker's reservation of its next job (workers/gpu/reservation.py) moves through a table
of the one state-machine primitive: where each state may go, and a move it does not hold refused
naming the reserved job and both states, the reservation left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import Settings
from app.statemachine import IllegalMove
from workers.gpu.reservation import ENDS, RESERVATION, WAITING, Reservation, State
from workers.gpu.tickets import Ticket, WorkerIdentity


def reservation(tmp_path: Path) -> Reservation:
    settings = Settings(_env_file=None, state_dir=tmp_path)  # type: ignore[call-arg]
    me = WorkerIdentity(name="w1", kind="cpu", device="")
    return Reservation(None, settings, me, spares=None, discard=lambda _: None)  # type: ignore[arg-type]


def ticket(job_id: int) -> Ticket:
    return Ticket(job_id, "probe", "/w", "/v", {}, 60.0, reserved=True)


@pytest.mark.parametrize(
    ("state", "onward"),
    [
        *[(end, {State.RESERVED}) for end in sorted(ENDS)],  # one order in every xdist worker
        (
            State.RESERVED,
            {State.STAGED, State.HANDED, State.GIVEN_BACK, State.TAKEN_OVER, State.LOST},
        ),
        (State.STAGED, {State.HANDED, State.GIVEN_BACK, State.TAKEN_OVER, State.LOST}),
        (State.HANDED, {State.STARTED, State.NOT_STARTED, State.LOST}),
    ],
)
def test_where_each_state_may_go(state: State, onward: set[State]) -> None:
    assert set(RESERVATION.onward(state)) == onward
    assert all(move.by and move.why for move in RESERVATION.moves)


def test_every_state_is_an_end_waiting_or_handed() -> None:
    assert ENDS | WAITING | {State.HANDED} == set(State)


def test_a_move_the_table_does_not_hold_names_the_job_and_both_states(tmp_path: Path) -> None:
    held = reservation(tmp_path)
    held.ticket = ticket(42)
    RESERVATION.move(held, State.RESERVED)
    assert held.state is State.RESERVED
    with pytest.raises(IllegalMove) as refused:
        RESERVATION.move(held, State.STARTED)  # only a handed reservation starts
    assert refused.value.detail == (
        "job reservation 42 cannot move from reserved to started: from reserved it may only "
        "become given_back, handed, lost, staged, taken_over"
    )
    assert refused.value.extra == {"from_state": "reserved", "to_state": "started"}
    assert held.state is State.RESERVED


def test_a_closed_run_of_a_reservation_not_handed_changes_nothing(tmp_path: Path) -> None:
    held = reservation(tmp_path)
    assert held.state is State.NONE and held.id is None
    held.closed(ticket(42), State.STARTED)  # not handed: not its run's to close
    assert held.state is State.NONE
