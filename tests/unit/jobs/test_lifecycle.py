"""A job's lifecycle (app/jobs/lifecycle.py): the table of moves, the one function that makes
them, the racing form the repository writes as a conditional UPDATE, and the state a run's end
leaves the job in."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.jobs import lifecycle
from app.jobs.lifecycle import (
    ACTIVE,
    ALLOWED,
    FINISHED,
    JOB,
    JOB_STATES,
    WAITING,
    End,
    JobState,
    StateName,
    state_after,
)
from app.jobs.models import Job
from app.statemachine import IllegalMove


def job(state: str, job_id: int = 7) -> Job:
    return Job(id=job_id, project_id=1, experiment="probe", queue="gpu.cpu", state=state)


def test_an_illegal_move_is_refused_naming_the_job_and_both_states() -> None:
    row = job("succeeded")
    with pytest.raises(IllegalMove) as refused:
        lifecycle.move(row, JobState.RUNNING, started_at=datetime.now(UTC))
    detail = refused.value.detail
    assert "job 7" in detail and "succeeded" in detail and "running" in detail
    assert refused.value.status == 409 and refused.value.slug == "illegal-job-move"
    assert refused.value.extra == {"from_state": "succeeded", "to_state": "running"}
    assert row.state == "succeeded" and row.started_at is None  # nothing was set


def test_a_legal_move_sets_the_state_and_its_fields() -> None:
    row = job("running")
    now = datetime.now(UTC)
    lifecycle.move(row, JobState.FAILED, error="boom", finished_at=now)
    assert (row.state, row.error, row.finished_at) == ("failed", "boom", now)
    assert type(row.state) is str  # the column holds the plain value


def test_the_state_is_the_move_not_a_field() -> None:
    with pytest.raises(TypeError):
        lifecycle.move(job("queued"), JobState.CANCELLED, state="failed")


@pytest.mark.parametrize(
    ("frm", "to"),
    [
        ("queued", "succeeded"),  # never started: cannot have succeeded
        ("queued", "running"),  # only a reserved job is handed over; a leased one starts
        ("reserved", "succeeded"),  # never started either
        ("reserved", "reserved"),
        ("leased", "reserved"),  # a lapsed lease goes back to the line, not to a reservation
        ("leased", "leased"),
        ("running", "leased"),
        ("failed", "queued"),
        ("cancelled", "running"),
        ("succeeded", "failed"),
    ],
)
def test_moves_the_table_does_not_hold_are_refused(frm: str, to: str) -> None:
    with pytest.raises(IllegalMove, match=f"from {frm} to {to}"):
        lifecycle.move(job(frm), JobState(to))


def test_nothing_leaves_a_finished_state_and_every_move_says_why() -> None:
    assert not [pair for pair in ALLOWED if pair[0] in FINISHED]
    assert all(move.why and move.by for made in ALLOWED.values() for move in made)


def test_every_state_is_reached_from_queued_and_every_live_one_can_finish() -> None:
    reached, frontier = {JobState.QUEUED}, [JobState.QUEUED]
    while frontier:
        here = frontier.pop()
        for frm, to in ALLOWED:
            if frm == here and to not in reached:
                reached.add(to)
                frontier.append(to)
    assert reached == set(JOB_STATES)
    for state in (*WAITING, *ACTIVE):
        assert {to for frm, to in ALLOWED if frm == state} & set(FINISHED)


@pytest.mark.parametrize(
    ("ended", "state"),
    [
        (End.COMPLETED, JobState.SUCCEEDED),
        (End.FAILED, JobState.FAILED),
        (End.TIMED_OUT, JobState.FAILED),
        (End.CANCELLED, JobState.CANCELLED),
        (End.FAILED_START, JobState.FAILED),
        (End.LEASE_LOST, JobState.FAILED),
    ],
)
def test_state_after_each_end(ended: End, state: JobState) -> None:
    assert state_after(ended) is state
    assert (JobState.RUNNING, state) in ALLOWED  # a running job can end so


def test_every_end_has_a_state_after_it() -> None:
    assert {state_after(e) for e in End} <= set(FINISHED)


def test_an_illegal_move_from_reserved_names_both_states() -> None:
    row = job("reserved", job_id=9)
    with pytest.raises(IllegalMove) as refused:
        lifecycle.move(row, JobState.SUCCEEDED)
    assert refused.value.detail == (
        "job 9 cannot move from reserved to succeeded: from reserved it may only become "
        "cancelled, failed, leased, queued, running"
    )
    assert refused.value.extra == {"from_state": "reserved", "to_state": "succeeded"}
    assert row.state == "reserved"


def test_a_reserved_job_is_handed_over_given_back_taken_over_or_ended_unstarted() -> None:
    assert JOB.onward(JobState.RESERVED) == ("cancelled", "failed", "leased", "queued", "running")
    for to, by in [
        (JobState.RUNNING, "repository.promote"),  # the hand-over
        (JobState.QUEUED, "reservations.release, reaping.reap"),  # given back, or lapsed
        (JobState.LEASED, "repository.claim"),  # taken over by an idle worker of its host
        (JobState.CANCELLED, "service.cancel"),
        (JobState.FAILED, "service.finish"),  # its handed run never began
    ]:
        (made,) = ALLOWED[(JobState.RESERVED, to)]
        assert made.by == by
    (reserve,) = ALLOWED[(JobState.QUEUED, JobState.RESERVED)]
    assert reserve.by == "reservations.reserve_next"
    row = job("reserved")
    lifecycle.move(row, JobState.QUEUED)
    assert row.state == "queued"


def test_a_racing_move_is_built_from_the_table() -> None:
    claim = lifecycle.guarded(JobState.QUEUED, JobState.LEASED)
    assert claim.frm == ("queued",) and claim.assign == {"state": "leased"}
    assert all(type(s) is str for s in (*claim.frm, *claim.assign.values()))
    with pytest.raises(IllegalMove, match="from succeeded to running"):
        lifecycle.guarded((JobState.LEASED, JobState.SUCCEEDED), JobState.RUNNING)


def test_the_api_filter_type_names_every_state() -> None:
    from typing import get_args

    assert get_args(StateName) == tuple(s.value for s in JOB_STATES)
