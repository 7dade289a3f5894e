"""A GPU host removes the exported trees of jobs finished long enough ago, and nothing else: not
an unfinished job's tree however old, not a recent job's, not what a job leaves for people (its
log, result.json, its runs' logs)."""

from __future__ import annotations

import fcntl
import os
from datetime import timedelta
from pathlib import Path

from app.clock import utcnow
from app.db import Stores
from app.jobs import paths
from app.jobs.models import Job
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from workers import job_trees


def _project(stores: Stores, name: str, tmp_path: Path) -> int:
    with stores.ops_session() as session:
        return ops.create_project(
            session, ProjectCreate(name=name, repo_url=str(tmp_path / "repo"))
        ).id


def _job(stores: Stores, project_id: int, state: str, finished_hours_ago: float | None) -> int:
    with stores.ops_session() as session:
        row = Job(project_id=project_id, experiment="probe", queue="gpu.cpu", state=state)
        if finished_hours_ago is not None:
            row.finished_at = utcnow() - timedelta(hours=finished_hours_ago)
        session.add(row)
        session.flush()
        return row.id


def _trees(settings: Settings, job_id: int) -> Path:
    folder = paths.job_dir(settings, job_id)
    for tree in ("src", "base"):
        (folder / tree / "pkg").mkdir(parents=True)
        (folder / tree / "pkg" / "module.py").write_text("x = 1\n")
    (folder / "job.log").write_text("run 1/1\n")
    (folder / "result.json").write_text("{}\n")
    (folder / "runs").mkdir()
    (folder / "runs" / "001-candidate.log").write_text("ok\n")
    # The fresh copy a run ran in, left behind by a worker killed mid-run.
    (folder / "runs" / "002-baseline" / "tree" / "pkg").mkdir(parents=True)
    return folder


def test_only_finished_jobs_trees_past_the_keep_time_go(
    stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    project_id = _project(stores, "trees", tmp_path)
    settings = settings.model_copy(update={"job_tree_keep_s": 3600.0})
    old_done = _job(stores, project_id, "succeeded", 5)
    old_failed = _job(stores, project_id, "failed", 2)
    recent = _job(stores, project_id, "succeeded", 0.1)
    waiting = _job(stores, project_id, "queued", None)  # prepared ahead days ago, still waiting
    running = _job(stores, project_id, "running", None)
    deleted = running + 1000  # its row went with its project
    folders = {
        job_id: _trees(settings, job_id)
        for job_id in (old_done, old_failed, recent, waiting, running, deleted)
    }
    # A folder's own age says nothing: only the ops DB's finished time counts.
    stale = utcnow().timestamp() - 10 * 86400
    for folder in folders.values():
        os.utime(folder, (stale, stale))

    assert job_trees.sweep(stores, settings) == 3
    for job_id, folder in folders.items():
        gone = job_id in (old_done, old_failed, deleted)
        assert (folder / "src").exists() is not gone and (folder / "base").exists() is not gone
        assert (folder / "runs" / "002-baseline").exists() is not gone
        # What the job leaves for people stays either way.
        assert (folder / "job.log").read_text() == "run 1/1\n"
        assert (folder / "result.json").exists() and (
            folder / "runs" / "001-candidate.log"
        ).exists()
    assert job_trees.sweep(stores, settings) == 0  # nothing left to remove


def test_one_worker_of_a_host_sweeps_every_few_minutes(
    stores: Stores, settings: Settings, tmp_path: Path
) -> None:
    project_id = _project(stores, "swept", tmp_path)
    settings = settings.model_copy(update={"job_tree_keep_s": 0.0})
    first = _trees(settings, _job(stores, project_id, "succeeded", 1))
    folder = first.parent
    # Another worker of the host is sweeping: this one leaves it to that one.
    with open(folder / job_trees.LOCK, "a+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert job_trees.sweep_if_due(stores, settings) == 0 and (first / "src").exists()
    assert job_trees.sweep_if_due(stores, settings) == 1 and not (first / "src").exists()
    # Finished just after: left for the host's next sweep, a few minutes on.
    second = _trees(settings, _job(stores, project_id, "cancelled", 0.01))
    assert job_trees.sweep_if_due(stores, settings) == 0 and (second / "src").exists()
    stamp = folder / job_trees.STAMP
    earlier = stamp.stat().st_mtime - job_trees.SWEEP_EVERY_S
    os.utime(stamp, (earlier, earlier))
    assert job_trees.sweep_if_due(stores, settings) == 1 and not (second / "src").exists()
