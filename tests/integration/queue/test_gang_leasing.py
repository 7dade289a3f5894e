"""Jobs of several GPUs on the real stores (app/jobs/gangs.py): all of a gang's GPUs are leased
in one transaction or none, a seated worker takes nothing else, the first gang in line reserves
its host against one-GPU jobs except those that end before it can start (backfill), a dead
member gives the job back, and the reaper frees a dead leader's seats."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from sqlalchemy import update

from app.dashboard import views
from app.db import Stores
from app.jobs import gangs, reaping
from app.jobs import repository as repo
from app.jobs import service as jobs
from app.jobs.lifecycle import End
from app.jobs.models import GangSeat, Job
from app.projects import config as project_config
from app.projects import service as ops
from app.settings import Settings
from tests.integration.queue.test_jobs_service import (
    expire_lease,
    make_project,
    mark_prepared,
    row,
)

# Both stacks: a gang's leases are taken in one transaction under PostgreSQL's row locks.
pytestmark = pytest.mark.stores("sqlite", "postgres")

HOST = socket.gethostname()
CONFIG = """
[project]
name = "{name}"
gpu_kind = "cpu"

[experiments.one]
entry = "probe.main"
time_limit_s = {short}

[experiments.four]
entry = "probe.main"
time_limit_s = 600
gpus = 4

[experiments.two]
entry = "probe.main"
time_limit_s = 600
gpus = 2
"""


class Host:
    """Four workers of one host, as the ops DB sees them; `down` are not alive."""

    def __init__(self, stores: Stores, n: int = 4) -> None:
        self.stores = stores
        self.down: set[str] = set()
        self.names = [f"w{i}" for i in range(n)]
        with stores.ops_session() as session:
            for i, name in enumerate(self.names):
                jobs.register_worker(session, name, "cpu", str(i), host=HOST, pid=1000 + i)

    def alive(self, worker: Any) -> bool:
        return worker.name not in self.down

    def lease(self, settings: Settings, worker: str) -> int | None:
        with self.stores.ops_session() as session:
            device = worker.removeprefix("w")
            job = jobs.lease_next(
                session,
                settings,
                queue="gpu.cpu",
                worker=worker,
                device=device,
                host=HOST,
                alive=self.alive,
            )
            return job.id if job else None

    def finish(self, job_id: int, worker: str) -> None:
        with self.stores.ops_session() as session:
            jobs.finish(session, job_id, worker, jobs.JobOutcome(ended=End.COMPLETED))


def submit(stores: Stores, settings: Settings, experiment: str, short: float = 60) -> int:
    config = project_config.parse(CONFIG.format(name="alpha", short=short))
    with stores.ops_session() as session:
        project = ops.get_project(session, "alpha")
        job_id = jobs.submit(session, settings, project, config, experiment, {}).id
    mark_prepared(stores, job_id)
    return job_id


def seats(stores: Stores) -> dict[str, int]:
    with stores.ops_session() as session:
        rows = session.query(GangSeat).all()
        return {seat.worker: seat.job_id for seat in rows}


def lease_device(stores: Stores, job_id: int) -> str:
    with stores.ops_session() as session:
        return gangs.lease_devices(session, job_id)


@pytest.fixture
def host(stores: Stores) -> Host:
    make_project(stores, "alpha")
    return Host(stores)


def test_a_gang_takes_all_its_gpus_at_once_or_none(
    stores: Stores, settings: Settings, host: Host
) -> None:
    # In line order (no window): the one-GPU job first in line takes a GPU before the gang.
    settings = settings.model_copy(update={"gang_window": 0})
    busy = submit(stores, settings, "one")
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") == busy
    # three free workers besides w0's job: the four-GPU job does not fit, and nothing is held
    assert host.lease(settings, "w1") is None
    assert seats(stores) == {}
    assert row(stores, gang).state == "queued"
    assert "waiting for 4 GPUs" in (row(stores, gang).wait_reason or "")
    host.finish(busy, "w0")
    assert host.lease(settings, "w2") == gang
    assert seats(stores) == {"w0": gang, "w1": gang, "w3": gang}
    assert lease_device(stores, gang) == "0,1,2,3"
    assert row(stores, gang).spec["gpus"] == 4
    # the queue page shows the seats: its members are not idle
    page = views.gpu_queue(settings, stores)
    assert page.seats == {"w0": gang, "w1": gang, "w3": gang}
    # every GPU of the host is busy now: its members take nothing (the leader runs the job),
    # and the budgets count all four
    later = submit(stores, settings, "one")
    for name in ("w0", "w1", "w3"):
        assert host.lease(settings, name) is None
    with stores.ops_session() as session:
        assert repo.active_count(session, None) == 4
    host.finish(gang, "w2")
    assert seats(stores) == {}
    assert host.lease(settings, "w1") == later


def test_two_gangs_never_hold_part_of_a_host_each(
    stores: Stores, settings: Settings, host: Host
) -> None:
    first, second = submit(stores, settings, "four"), submit(stores, settings, "four")
    assert host.lease(settings, "w3") == first
    assert all(host.lease(settings, name) is None for name in ("w0", "w1", "w2"))
    assert row(stores, second).state == "queued"
    host.finish(first, "w3")
    assert host.lease(settings, "w0") == second
    assert set(seats(stores)) == {"w1", "w2", "w3"}


def test_a_waiting_gang_reserves_its_host_with_backfill_of_short_jobs(
    stores: Stores, settings: Settings, host: Host
) -> None:
    running = submit(stores, settings, "one", short=600)  # holds w0 for up to 600 s
    assert host.lease(settings, "w0") == running
    gang = submit(stores, settings, "four")
    long_one = submit(stores, settings, "one", short=3600)
    short_one = submit(stores, settings, "one", short=30)
    # w1 skips the long job (it would delay the gang) and backfills the short one
    assert host.lease(settings, "w1") == short_one
    assert "reserved for job" in (row(stores, long_one).wait_reason or "")
    assert row(stores, long_one).state == "queued"
    host.finish(short_one, "w1")
    host.finish(running, "w0")
    # the gang goes first once its GPUs are free, then the long job
    assert host.lease(settings, "w0") == gang
    host.finish(gang, "w0")
    assert host.lease(settings, "w0") == long_one


def test_a_host_too_small_never_holds_a_gang(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    small = Host(stores, n=2)
    gang = submit(stores, settings, "four")
    pair = submit(stores, settings, "two")
    one = submit(stores, settings, "one")
    assert small.lease(settings, "w0") == pair
    assert "has 2 of its kind" in (row(stores, gang).wait_reason or "")
    assert small.lease(settings, "w1") is None  # seated in the pair's gang
    small.finish(pair, "w0")
    assert small.lease(settings, "w1") == one


def test_a_dead_worker_is_never_seated(stores: Stores, settings: Settings, host: Host) -> None:
    host.down.add("w1")
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") is None
    assert "has 3 of its kind" in (row(stores, gang).wait_reason or "")
    host.down.clear()
    assert host.lease(settings, "w0") == gang


def test_a_dead_member_gives_the_job_back_and_frees_every_gpu(
    stores: Stores, settings: Settings, host: Host
) -> None:
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") == gang
    with stores.ops_session() as session:
        assert gangs.lost_members(session, gang, host.alive) == []
    host.down.add("w2")
    with stores.ops_session() as session:
        assert gangs.lost_members(session, gang, host.alive) == ["w2"]
        assert reaping.give_back_gang(session, gang, "w0", "gang member w2 stopped")
    job = row(stores, gang)
    assert (job.state, job.attempts, job.worker) == ("queued", 1, None)
    assert seats(stores) == {}
    with stores.ops_session() as session:
        assert repo.lease_of(session, gang) is None
        assert repo.active_count(session, None) == 0
        assert not reaping.give_back_gang(session, gang, "w0", "again")  # no longer w0's


def test_the_reaper_frees_a_dead_leaders_seats(
    stores: Stores, settings: Settings, host: Host
) -> None:
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w1") == gang
    expire_lease(stores, gang)
    with stores.ops_session() as session:
        reaped = reaping.reap(session, settings)
    assert gang in reaped.requeued
    assert seats(stores) == {}
    assert row(stores, gang).state == "queued"


def test_the_peak_budget_counts_every_gpu_of_a_gang(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha", budget_concurrent_gpus=3)
    host = Host(stores)
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") is None
    assert "this job needs 4" in (row(stores, gang).wait_reason or "")
    with stores.ops_session() as session:
        session.execute(update(Job).where(Job.id == gang).values(state="cancelled"))
    pair = submit(stores, settings, "two")
    assert host.lease(settings, "w0") == pair
    with stores.ops_session() as session:
        assert repo.active_count(session, None) == 2


def test_a_reserving_worker_never_reserves_a_gang_nor_past_one(
    stores: Stores, settings: Settings, host: Host
) -> None:
    from app.jobs import reservations

    running = submit(stores, settings, "one")
    assert host.lease(settings, "w0") == running
    submit(stores, settings, "four")
    submit(stores, settings, "one")
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})
    with stores.ops_session() as session:
        assert (
            reservations.reserve_next(
                session, at_once, queue="gpu.cpu", worker="w0", device="0", host=HOST
            )
            is None
        )


def test_a_busy_worker_reserves_nothing_while_a_worker_of_its_host_is_idle(
    stores: Stores, settings: Settings
) -> None:
    from app.jobs import reservations

    make_project(stores, "alpha")
    host = Host(stores, n=2)
    running, waiting = submit(stores, settings, "one"), submit(stores, settings, "one")
    assert host.lease(settings, "w0") == running
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})

    def reserve() -> Job | None:
        with stores.ops_session() as session:
            return reservations.reserve_next(
                session, at_once, queue="gpu.cpu", worker="w0", device="0", host=HOST,
                alive=host.alive,
            )  # fmt: skip

    # w1 is idle: the waiting job is its to take, not w0's to hold until its job ends
    assert reserve() is None
    assert row(stores, waiting).state == "queued"
    # w1 is gone (or busy): w0 reserves it
    host.down.add("w1")
    reserved = reserve()
    assert reserved is not None and reserved.id == waiting


def test_a_host_prepares_up_to_a_gang_within_the_window(
    stores: Stores, settings: Settings, host: Host
) -> None:
    """A job of several GPUs goes first only once prepared on the host: the preparer prepares up
    to it when it is within the window, and an idle worker only when it fits the host now."""
    first, _ = submit(stores, settings, "one"), submit(stores, settings, "one")
    submit(stores, settings, "four")

    def want(window: int, asking: str | None = None) -> int:
        with stores.ops_session() as session:
            return gangs.ready_for_window(
                session, queue="gpu.cpu", window=window, host=HOST, asking=asking,
                alive=host.alive if asking else None,
            )  # fmt: skip

    assert want(8) == 3  # the gang is third in line
    assert want(2) == 0  # beyond the window
    assert want(0) == 0  # line order
    assert want(8, asking="w0") == 3  # all four GPUs free
    host.down.add("w3")
    assert want(8, asking="w0") == 0  # three: it would not go first
    host.down.clear()
    in_order = settings.model_copy(update={"gang_window": 0})
    assert host.lease(in_order, "w1") == first
    assert want(8) == 2
    assert want(8, asking="w0") == 0  # w1 is busy


def test_a_gangs_leader_reserves_nothing(stores: Stores, settings: Settings, host: Host) -> None:
    """The end of a job of several GPUs frees all of them at once: what runs next on them is the
    line's to say then (a job of several GPUs close behind may go first), not a reservation."""
    from app.jobs import reservations

    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") == gang
    waiting = submit(stores, settings, "one")
    at_once = settings.model_copy(update={"gpu_reserve_after_s": 0.0})

    def reserve(worker: str) -> Job | None:
        with stores.ops_session() as session:
            return reservations.reserve_next(
                session, at_once, queue="gpu.cpu", worker=worker, device=worker[1:], host=HOST,
                alive=host.alive,
            )  # fmt: skip

    assert reserve("w0") is None
    assert row(stores, waiting).state == "queued"
    host.finish(gang, "w0")
    # a leader of a one-GPU job reserves as before
    running = submit(stores, settings, "one")
    assert host.lease(settings, "w0") == waiting
    assert host.lease(settings, "w1") == running
    for name in ("w2", "w3"):
        host.down.add(name)
    later = submit(stores, settings, "one")
    reserved = reserve("w0")
    assert reserved is not None and reserved.id == later


def test_a_gang_close_behind_that_fits_now_goes_first(
    stores: Stores, settings: Settings, host: Host
) -> None:
    """With the host's GPUs free, a job of several GPUs within `gang_window` of the job a worker
    would take goes first (the one-GPU jobs say why they wait); one further back does not, nor
    one that does not fit now."""
    settings = settings.model_copy(update={"gang_window": 3})
    first, second = submit(stores, settings, "one"), submit(stores, settings, "one")
    gang = submit(stores, settings, "four")
    assert host.lease(settings, "w0") == gang  # within 3 of `first`, and all four GPUs free
    assert set(seats(stores)) == {"w1", "w2", "w3"}
    assert "passed by job" in (row(stores, first).wait_reason or "")
    host.finish(gang, "w0")
    # Now three one-GPU jobs and a gang four places behind the first: in line order.
    third = submit(stores, settings, "one")
    far = submit(stores, settings, "four")
    assert host.lease(settings, "w0") == first
    # w0 busy: the gang (within 3 of `second` now) does not fit, so nothing passes `second`.
    assert host.lease(settings, "w1") == second
    assert host.lease(settings, "w2") == third
    assert row(stores, far).state == "queued"
