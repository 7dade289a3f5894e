"""Each GPU host's preparation of a job, on the real stores: who may claim it, when it becomes
leasable and by whom, what a failure on one host does, and a preparer that died."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from app.clock import utcnow
from app.db import Stores
from app.jobs import preparation
from app.jobs import service as jobs
from app.jobs.models import Job, JobPreparation
from app.settings import Settings
from tests.integration.queue.test_jobs_service import make_project, submit

# Both stacks: hosts race to prepare and take over preparations.
pytestmark = pytest.mark.stores("sqlite", "postgres")


def lease_on(stores: Stores, settings: Settings, host: str) -> int | None:
    with stores.ops_session() as session:
        job = jobs.lease_next(
            session, settings, queue="gpu.cpu", worker=f"w@{host}", device="", host=host
        )
        return None if job is None else job.id


def test_a_job_is_leased_only_on_a_host_that_prepared_it(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", prepare=False)
    with stores.ops_session() as session:
        assert preparation.needs_preparation(session, "gpu.cpu", "host-a", 10) == [job_id]
        assert preparation.claim_preparation(session, job_id, "host-a") is not None
        # claimed on host-a: not again there (unless its preparer is known to be gone), but
        # host-b may prepare it too
        assert preparation.claim_preparation(session, job_id, "host-a") is None
        assert preparation.needs_preparation(session, "gpu.cpu", "host-b", 10) == [job_id]
    assert lease_on(stores, settings, "host-a") is None  # still preparing
    with stores.ops_session() as session:
        assert preparation.preparation_ready(
            session, job_id, "host-a", workdir="/a/src", venv_path="/a/venv"
        )
        assert preparation.ready_on(session, "gpu.cpu", "host-a") == 1
        assert preparation.ready_on(session, "gpu.cpu", "host-b") == 0
    assert lease_on(stores, settings, "host-b") is None  # not prepared there
    assert lease_on(stores, settings, "host-a") == job_id
    with stores.ops_session() as session:
        job = session.get(Job, job_id)
        assert job is not None
        assert (job.workdir, job.venv_path) == ("/a/src", "/a/venv")  # where it runs
        assert job.prepared_at is not None
        # a leased job needs no preparation anywhere any more
        assert preparation.claim_preparation(session, job_id, "host-b") is None


def test_a_failure_on_one_host_leaves_the_job_to_the_others(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", prepare=False)
    with stores.ops_session() as session:
        for host in ("host-a", "host-b"):  # two hosts of the kind, both seen just now
            jobs.register_worker(session, f"w@{host}", "cpu", "0", host=host)
        assert preparation.claim_preparation(session, job_id, "host-a") is not None
        failed_now = preparation.preparation_failed(
            session, settings, job_id, "host-a", "venv build failed: no space left"
        )
        assert not failed_now
        assert session.get(Job, job_id).state == "queued"  # type: ignore[union-attr]
        assert preparation.claim_preparation(session, job_id, "host-a") is None  # not retried
        assert preparation.claim_preparation(session, job_id, "host-b") is not None
        assert preparation.preparation_failed(
            session, settings, job_id, "host-b", "venv build failed: bad requirement"
        )
        job = session.get(Job, job_id)
        assert job is not None and job.state == "failed"
        assert "host-b" in (job.error or "") and "bad requirement" in (job.error or "")


def test_a_preparation_left_unfinished_is_taken_over(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", prepare=False)
    with stores.ops_session() as session:
        assert preparation.claim_preparation(session, job_id, "host-a") is not None
        assert preparation.claim_preparation(session, job_id, "host-a", stale_after_s=60) is None
        session.execute(
            update(JobPreparation)
            .where(JobPreparation.job_id == job_id)
            .values(started_at=utcnow() - timedelta(seconds=120))
        )
        # its preparer died two minutes ago: this host's next worker takes it over
        assert preparation.claim_preparation(session, job_id, "host-a", stale_after_s=60)


def test_a_preparer_killed_mid_preparation_is_taken_over_by_the_next(
    stores: Stores, settings: Settings
) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", prepare=False)
    with stores.ops_session() as session:
        assert preparation.claim_preparation(session, job_id, "host-a") is not None
    # ...its worker was SIGKILLed: the row still says "preparing". The job is still listed for
    # this host, and a preparer holding the host's lock for it (so none is alive) takes over.
    with stores.ops_session() as session:
        assert preparation.needs_preparation(session, "gpu.cpu", "host-a", 10) == [job_id]
        assert preparation.claim_preparation(session, job_id, "host-a", preparer_gone=True)
        assert preparation.preparation_ready(
            session, job_id, "host-a", workdir="/s", venv_path="/v"
        )
        assert preparation.needs_preparation(session, "gpu.cpu", "host-a", 10) == []


def test_a_cancelled_job_is_not_prepared(stores: Stores, settings: Settings) -> None:
    make_project(stores, "alpha")
    job_id = submit(stores, settings, "alpha", prepare=False)
    with stores.ops_session() as session:
        jobs.cancel(session, job_id, "someone")
        assert preparation.needs_preparation(session, "gpu.cpu", "host-a", 10) == []
        assert preparation.claim_preparation(session, job_id, "host-a") is None
