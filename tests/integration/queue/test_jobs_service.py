"""The queue's service on the real stores (SQLite and PostgreSQL), without workers or a broker:
order across projects, both budgets, the reaper, cancellation, lost leases and bad input."""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from app.db import Stores
from app.errors import InvalidInput
from app.jobs import figures, preparation, reaping
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.jobs.models import Job, Lease
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.models import Project
from app.projects.schemas import ProjectCreate
from app.settings import Settings

# Both stacks: leasing takes its job under SKIP LOCKED on PostgreSQL.
pytestmark = pytest.mark.stores("sqlite", "postgres")

CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"

[experiments.probe]
entry = "probe.main"
time_limit_s = {limit}

[experiments.probe.parameters]
sleep_s = [0.05, 0.5]

[experiments.probe.defaults]
sleep_s = 0.05
"""


def make_project(stores: Stores, name: str, **budget: Any) -> None:
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name=name, repo_url=f"/srv/{name}"))
        for key, value in budget.items():
            setattr(project, key, value)


def submit(
    stores: Stores,
    settings: Settings,
    name: str,
    *,
    prepare: bool = True,
    limit: int = 60,
    **kw: Any,
) -> int:
    config = project_config.parse(CONFIG.format(name=name, limit=limit))
    with stores.ops_session() as session:
        project = ops.get_project(session, name)
        job_id = jobs.submit(
            session, settings, project, config, "probe", kw.pop("params", {}), **kw
        ).id
    if prepare:
        mark_prepared(stores, job_id)
    return job_id


def mark_prepared(stores: Stores, job_id: int) -> None:
    with stores.ops_session() as session:
        # a host that prepared it synchronously: claimed and ready in one go
        assert preparation.claim_preparation(session, job_id, socket.gethostname()) is not None
        assert preparation.preparation_ready(
            session, job_id, socket.gethostname(), workdir="/w", venv_path="/v"
        )
        job = session.get(Job, job_id)
        assert job is not None
        job.spec = {**job.spec, "entry": "probe.main"}


def lease(stores: Stores, settings: Settings, worker: str = "w1") -> int | None:
    with stores.ops_session() as session:
        job = jobs.lease_next(session, settings, queue="gpu.cpu", worker=worker, device="")
        return job.id if job else None


def finish(stores: Stores, job_id: int, worker: str = "w1", gpu_seconds: float = 1.0) -> None:
    with stores.ops_session() as session:
        jobs.finish(
            session, job_id, worker, jobs.JobOutcome(ended=End.COMPLETED, gpu_seconds=gpu_seconds)
        )


def row(stores: Stores, job_id: int) -> Job:
    with stores.ops_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        session.expunge(job)
        return job


def expire_lease(stores: Stores, job_id: int) -> None:
    with stores.ops_session() as session:
        session.execute(
            update(Lease)
            .where(Lease.job_id == job_id)
            .values(expires_at=jobs.utcnow() - timedelta(seconds=1))
        )


def counts(stores: Stores) -> tuple[int, int]:
    with stores.ops_session() as session:
        return (
            session.scalar(select(func.count()).select_from(Job)) or 0,
            session.scalar(select(func.count()).select_from(Lease)) or 0,
        )


def test_jobs_leave_in_submission_order_across_projects(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    make_project(stores, "beta")
    ids = [
        submit(stores, settings, name, prepare=False) for name in ("alpha", "beta", "alpha", "beta")
    ]
    for job_id in reversed(ids):  # the last submitted is ready first
        mark_prepared(stores, job_id)
    leased = [lease(stores, settings, worker=f"w{i}") for i in range(4)]
    assert leased == ids
    assert lease(stores, settings, worker="w9") is None


def test_unprepared_jobs_do_not_take_a_gpu(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    first = submit(stores, settings, "alpha", prepare=False)
    second = submit(stores, settings, "alpha")
    assert lease(stores, settings) == second
    assert row(stores, first).state == "queued"


def test_project_peak_budget_waits_while_others_lease(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha", budget_concurrent_gpus=1)
    make_project(stores, "beta")
    a1, a2 = submit(stores, settings, "alpha"), submit(stores, settings, "alpha")
    b1 = submit(stores, settings, "beta")
    assert lease(stores, settings, "w1") == a1
    # a2 is older than b1, but alpha already uses its one GPU: b1 goes first, a2 waits.
    assert lease(stores, settings, "w2") == b1
    assert lease(stores, settings, "w3") is None
    waiting = row(stores, a2)
    assert waiting.state == "queued"
    assert waiting.wait_reason == "peak budget: project alpha uses 1/1 GPUs"
    finish(stores, a1)
    assert lease(stores, settings, "w1") == a2
    assert row(stores, a2).wait_reason is None


def test_many_waiting_jobs_of_a_blocked_project_do_not_block_the_next(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha", budget_concurrent_gpus=1)
    make_project(stores, "beta")
    first = submit(stores, settings, "alpha")
    behind = [submit(stores, settings, "alpha") for _ in range(25)]  # more than one batch
    other = submit(stores, settings, "beta")
    assert lease(stores, settings, "w1") == first
    assert lease(stores, settings, "w2") == other
    assert all(row(stores, j).wait_reason for j in behind)


def test_global_peak_budget(stores: Stores, settings: Settings) -> None:
    settings = settings.model_copy(update={"budget_concurrent_gpus": 2})
    make_project(stores, "alpha")
    make_project(stores, "beta")
    a1, b1, a2 = (submit(stores, settings, n) for n in ("alpha", "beta", "alpha"))
    assert [lease(stores, settings, "w1"), lease(stores, settings, "w2")] == [a1, b1]
    assert lease(stores, settings, "w3") is None
    assert row(stores, a2).wait_reason == "peak budget: global uses 2/2 GPUs"
    finish(stores, b1, "w2")
    assert lease(stores, settings, "w2") == a2


def test_average_budget_is_checked_apart_from_the_peak(stores: Stores, settings: Settings) -> None:
    # Peak allows two GPUs, but one long job used the day's GPU-hours: the next one waits.
    make_project(stores, "alpha", budget_gpu_hours_per_day=1.0, budget_concurrent_gpus=2)
    make_project(stores, "beta")
    a1, a2 = submit(stores, settings, "alpha"), submit(stores, settings, "alpha")
    assert lease(stores, settings) == a1
    finish(stores, a1, gpu_seconds=3700.0)
    b1 = submit(stores, settings, "beta")
    assert lease(stores, settings, "w2") == b1
    waiting = row(stores, a2)
    assert waiting.state == "queued"
    assert waiting.wait_reason is not None and waiting.wait_reason.startswith("average budget:")
    assert "project alpha used 1.03/1 GPU-hours" in waiting.wait_reason
    # Under the average, the peak still holds on its own: one more GPU, not two.
    with stores.ops_session() as session:
        project = ops.get_project(session, "alpha")
        project.budget_gpu_hours_per_day = 10.0
        project.budget_concurrent_gpus = 1
    a3 = submit(stores, settings, "alpha")
    assert lease(stores, settings, "w3") == a2
    assert lease(stores, settings, "w4") is None
    assert (row(stores, a3).wait_reason or "").startswith("peak budget:")


def test_global_average_budget(stores: Stores, settings: Settings) -> None:
    settings = settings.model_copy(update={"budget_gpu_hours_per_day": 0.5})
    make_project(stores, "alpha")
    make_project(stores, "beta")
    a1 = submit(stores, settings, "alpha")
    assert lease(stores, settings) == a1
    finish(stores, a1, gpu_seconds=1800.0)
    b1 = submit(stores, settings, "beta")
    assert lease(stores, settings) is None
    assert (row(stores, b1).wait_reason or "").startswith("average budget: global used 0.50/0.5")


def test_reaper_requeues_then_fails_after_max_attempts(stores: Stores, settings: Settings) -> None:
    settings = settings.model_copy(update={"job_max_attempts": 2})
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha")
    assert lease(stores, settings, "w1") == job_id
    with stores.ops_session() as session:
        assert reaping.reap(session, settings).requeued == []  # a live lease is left alone
    expire_lease(stores, job_id)
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert reaped.requeued == [job_id] and reaped.run_doorbells == ["gpu.cpu"]
    again = row(stores, job_id)
    assert (again.state, again.attempts, again.worker) == ("queued", 1, None)
    assert counts(stores) == (1, 0)
    # The export it ran in is not reused: the host prepares the job afresh before a retry.
    assert lease(stores, settings, "w2") is None
    with stores.ops_session() as session:
        assert preparation.preparation_on(session, job_id, socket.gethostname()) is None
    mark_prepared(stores, job_id)

    assert lease(stores, settings, "w2") == job_id
    expire_lease(stores, job_id)
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert reaped.failed == [job_id] and reaped.requeued == []
    failed = row(stores, job_id)
    assert (failed.state, failed.attempts) == ("failed", 2)
    assert failed.error is not None and "lease expired 2 times" in failed.error
    assert "w2" in failed.error and failed.finished_at is not None
    assert counts(stores) == (1, 0)


def test_reaper_cancels_an_expired_job_whose_cancel_was_asked(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha")
    assert lease(stores, settings) == job_id
    with stores.ops_session() as session:
        assert jobs.cancel(session, job_id, by="alice").state == "leased"  # told, not yet stopped
    expire_lease(stores, job_id)
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert reaped.requeued == [] and reaped.failed == []
    done = row(stores, job_id)
    assert (done.state, done.cancelled_by) == ("cancelled", "alice")
    assert counts(stores) == (1, 0)


def test_reaper_rings_again_for_jobs_waiting_too_long(stores: Stores, settings: Settings) -> None:
    settings = settings.model_copy(update={"doorbell_stale_s": 60.0})
    make_project(stores, "alpha")
    unprepared = submit(stores, settings, "alpha", prepare=False)
    prepared = submit(stores, settings, "alpha")
    with stores.ops_session() as session:
        assert reaping.reap(session, settings).prepare_doorbells == []  # not stale yet
        past = jobs.utcnow() - timedelta(seconds=120)
        session.execute(
            update(Job).values(submitted_at=past, prepared_at=None).where(Job.id == unprepared)
        )
        session.execute(update(Job).values(prepared_at=past).where(Job.id == prepared))
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert reaped.prepare_doorbells == [unprepared]
    assert reaped.run_doorbells == ["gpu.cpu"]


def test_cancel_queued_then_finished_is_409(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha")
    with stores.ops_session() as session:
        assert jobs.cancel(session, job_id, by="cli").state == "cancelled"
    assert lease(stores, settings) is None  # a cancelled job never takes a GPU
    with pytest.raises(jobs.JobFinished) as caught, stores.ops_session() as session:
        jobs.cancel(session, job_id, by="bob")
    assert caught.value.status == 409 and "already cancelled" in caught.value.detail
    assert row(stores, job_id).cancelled_by == "cli"
    with pytest.raises(jobs.JobNotFound), stores.ops_session() as session:
        jobs.cancel(session, 999, by="cli")


def test_finish_without_the_lease_records_nothing(stores: Stores, settings: Settings) -> None:
    settings = settings.model_copy(update={"job_max_attempts": 3})
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha")
    assert lease(stores, settings, "old") == job_id
    expire_lease(stores, job_id)
    with stores.ops_session() as session:
        reaping.reap(session, settings)
    mark_prepared(stores, job_id)  # afresh on its host, as after any lapsed lease
    assert lease(stores, settings, "new") == job_id
    with pytest.raises(jobs.LeaseLost), stores.ops_session() as session:
        jobs.finish(
            session, job_id, "old", jobs.JobOutcome(ended=End.FAILED, error="late", gpu_seconds=9)
        )
    with pytest.raises(jobs.LeaseLost), stores.ops_session() as session:
        jobs.heartbeat(session, settings, job_id, "old")
    current = row(stores, job_id)
    assert (current.state, current.worker, current.error, current.gpu_seconds) == (
        "leased",
        "new",
        None,
        0.0,
    )
    finish(stores, job_id, "new", gpu_seconds=2.0)
    done = row(stores, job_id)
    assert (done.state, done.gpu_seconds, done.attempts) == ("succeeded", 2.0, 2)
    assert counts(stores) == (1, 0)


@pytest.mark.parametrize(
    ("params", "queue", "experiment", "limit", "needle"),
    [
        ({}, "gpu.tpu", "probe", 60, "unknown queue 'gpu.tpu'"),
        ({}, "cpu", "probe", 60, "unknown queue 'cpu'"),
        ({}, None, "nope", 60, "experiment 'nope' is not declared"),
        ({"sleep_s": 7}, None, "probe", 60, "sleep_s=7 is outside the declared space"),
        ({"threads": 2}, None, "probe", 60, "parameter 'threads' is not declared"),
        ({}, None, "probe", 7200, "above the per-job limit 3600"),
    ],
)
def test_bad_input_stores_nothing(
    stores: Stores,
    settings: Settings,
    params: dict[str, Any],
    queue: str | None,
    experiment: str,
    limit: int,
    needle: str,
) -> None:
    settings = settings.model_copy(update={"max_job_time_limit_s": 3600.0})
    make_project(stores, "alpha")
    config = project_config.parse(CONFIG.format(name="alpha", limit=limit))
    with stores.ops_session() as session:
        project = ops.get_project(session, "alpha")
        with pytest.raises(InvalidInput) as caught:
            jobs.submit(session, settings, project, config, experiment, params, queue=queue)
    assert needle in caught.value.detail and caught.value.status == 422
    assert counts(stores) == (0, 0)
    with stores.ops_session() as session:
        assert session.scalar(select(func.count()).select_from(Project)) == 1


def test_queue_summary_counts_depth_and_oldest(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    first = submit(stores, settings, "alpha")
    submit(stores, settings, "alpha")
    submit(stores, settings, "alpha")
    assert lease(stores, settings) == first
    with stores.ops_session() as session:
        summary = {q["queue"]: q for q in figures.queues(session, settings)}
        oldest = row(stores, first + 1).submitted_at
    cpu = summary["gpu.cpu"]
    assert (cpu["queued"], cpu["leased"], cpu["running"]) == (2, 1, 0)
    assert cpu["oldest_queued_at"].replace(tzinfo=None) == oldest.replace(tzinfo=None)
    assert summary["gpu.h100"]["queued"] == 0


def test_a_long_wait_is_rung_again_at_doubling_intervals_not_every_tick(settings: Settings) -> None:
    settings = settings.model_copy(update={"doorbell_stale_s": 30.0, "reaper_interval_s": 10.0})
    # One reaper tick every 10 s over 33 minutes of waiting: rung at 30, 60, 120, 240, 480 s,
    # then every 480 s (16 x stale) so that a missed window never costs hours.
    ticks = [float(t) for t in range(0, 2000, 10)]
    rung = [t for t in ticks if reaping.doorbell_due(t + 0.5, settings)]
    assert rung == [30.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1440.0, 1920.0]
    assert not reaping.doorbell_due(29.9, settings)


def test_each_job_draws_a_seed_of_its_own_unless_one_is_fixed(
    stores: Stores, settings: Settings
) -> None:
    """The seed of a job's inputs, run order and bootstraps is drawn by the control plane at
    submission: a candidate written before cannot know it."""
    make_project(stores, "alpha")
    drawn = [
        row(stores, submit(stores, settings, "alpha", prepare=False)).spec["seed"] for _ in range(8)
    ]
    assert all(isinstance(s, int) and 0 <= s < jobs.SEED_RANGE for s in drawn), drawn
    assert len(set(drawn)) > 1, drawn  # 8 draws from 2**31 alike: odds of 2**-217
    fixed = submit(stores, settings, "alpha", prepare=False, seed=1234)
    assert row(stores, fixed).spec["seed"] == 1234
