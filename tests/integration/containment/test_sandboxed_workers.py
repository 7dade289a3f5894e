"""Real GPU worker processes with the sandbox on (the production default): jobs run confined and
say so, the next job is handed to an interpreter parked in its own sandbox, and a cancelled job's
whole cgroup goes."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.db import Stores
from app.jobs import service as jobs
from app.sandbox import cgroups
from tests.integration.queue.conftest import (  # noqa: F401 - fixtures used by name
    Workers,
    broker_url,
    make_repo,
    queue_settings,
    shared_venv_root,
    workers,
)
from tests.integration.queue.test_workers import finished, submit
from tests.support import alive, wait_for
from workers import prepare


@pytest.fixture
def confined(workers: Workers) -> Workers:  # noqa: F811 - the fixture
    assert workers.settings.sandbox == "on"  # conftest: queue_sandbox
    return workers


def job_cgroup(job_id: int) -> Path:
    """The job's cgroup, made by the worker process that runs it (`job-<id>.w<pid>`)."""
    found = sorted(cgroups.cgroup_base().glob(f"job-{job_id}.w*"))
    return found[0] if found else cgroups.cgroup_base() / f"job-{job_id}.w-none"


def test_sandboxed_jobs_record_it_and_the_next_runs_in_its_parked_sandbox(
    confined: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-sb")
    first = submit(stores, confined, repo, sleep_s=3)
    second = submit(stores, confined, repo, sleep_s=0.05)
    confined.start_api()  # preparation fetches each job's commit from the control host
    for job_id in (first, second):  # both ready on this host before the GPU worker starts
        assert prepare.prepare_job(stores, confined.settings, job_id)
    confined.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    done = wait_for(lambda: finished(stores, second), timeout=120)
    assert done.state == "succeeded", (done.error, confined.logs())
    earlier = finished(stores, first)
    assert earlier is not None and earlier.state == "succeeded"
    for row in (earlier, done):
        assert row.result is not None and row.result["sandbox"] == "on"
        log_text = Path(row.log_path or "").read_text()
        assert "[sandbox] off" not in log_text
    # The spare was parked for the second job, bound to its export, and took it.
    assert "[launch] handed to the parked interpreter" in Path(done.log_path or "").read_text()
    wait_for(lambda: not job_cgroup(second).exists(), timeout=10)


def test_cancelling_a_sandboxed_job_kills_its_whole_cgroup(
    confined: Workers, stores: Stores, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path, "probe-sbc")
    confined.start("control", "control")
    confined.start("gpu", "gpu", "--kind", "cpu", "--device", "0")
    job_id = submit(stores, confined, repo, sleep_s=60, grandchild=1)

    def members() -> list[int]:
        try:  # the worker makes the cgroup when it takes the job
            return [int(pid) for pid in (job_cgroup(job_id) / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    # bwrap, its init, the job and its `sleep` grandchild, by their host pids
    pids = wait_for(lambda: (found := members()) and len(found) >= 4 and found, timeout=120)
    with stores.ops_session() as session:
        jobs.cancel(session, job_id, by="alice")
    row = wait_for(lambda: finished(stores, job_id), timeout=60)
    assert row.state == "cancelled"
    wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10)
    wait_for(lambda: not job_cgroup(job_id).exists(), timeout=10)
