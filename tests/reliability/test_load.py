"""500 jobs queued at once against 2 GPU workers: none lost, none run twice, budgets respected.

Standalone jobs of the probe experiment go in through the job service and the broker, as the
API and the cycle machine submit them (`jobs.submit`, then the `prepare` doorbell); full cycles
would spend the time in git and the forge rather than in the queue. Half the jobs belong to a
project capped at one GPU at a time: its jobs' leased-to-finished intervals must never overlap.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app import broker
from app.cycles import service as cycle_service
from app.cycles import states
from app.cycles.models import Cycle
from app.db import Stores
from app.forge.models import PullRequestRecord as PullRequestRow
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from tests.conftest import Backend
from tests.integration.queue.conftest import Workers, make_repo
from tests.reliability.conftest import (
    ensure_project,
    job_rows,
    leases_of,
    production_variant_only,
    runs,
    tally,
    variant,
)
from tests.support import wait_for

pytestmark = [
    pytest.mark.reliability,
    pytest.mark.stores("sqlite", "postgres"),
    pytest.mark.timeout(330),
]

JOBS = int(os.environ.get("AUTOPILOT_RELIABILITY_LOAD_JOBS", "500"))
SLEEP_S = 0.05


def _finished_count(stores: Stores, ids: list[int]) -> int:
    with stores.ops_session() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.id.in_(ids), Job.state.in_(("succeeded", "failed", "cancelled")))
            )
            or 0
        )


def _aware(value: datetime | None) -> datetime:
    assert value is not None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_jobs_queued_against_two_gpu_workers(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    production_variant_only(backend.name)
    # Production-like reaper timing: a backlog is not a lost doorbell (see docs/operations.md).
    workers.settings = workers.settings.model_copy(
        update={"lease_ttl_s": 30.0, "doorbell_stale_s": 60.0, "reaper_interval_s": 5.0}
    )
    settings = workers.settings
    capped_repo, free_repo = make_repo(tmp_path, "load-capped"), make_repo(tmp_path, "load-free")
    capped_id = ensure_project(stores, capped_repo, budget_concurrent_gpus=1)
    ensure_project(stores, free_repo)
    cfg = {r.name: project_config.load(r) for r in (capped_repo, free_repo)}

    workers.start("control", "control", "--beat")
    workers.start("gpu0", "gpu", "--kind", "cpu", "--device", "0")
    workers.start("gpu1", "gpu", "--kind", "cpu", "--device", "1")
    began = time.monotonic()
    with stores.ops_session() as session:
        projects = [ops.get_project(session, r.name) for r in (capped_repo, free_repo)]
        ids = [
            jobs.submit(session, settings, p, cfg[p.name], "probe", {"sleep_s": SLEEP_S}).id
            for i in range(JOBS)
            for p in [projects[i % 2]]
        ]
    for _ in ids:  # one doorbell per submission, as the API rings them
        broker.ring_gpu(settings, "gpu.cpu")
    submitted_s = time.monotonic() - began

    wait_for(lambda: _finished_count(stores, ids) == len(ids), timeout=300, interval=1.0)
    wall_s = time.monotonic() - began
    rows = job_rows(stores, ids)

    assert all(r.state == "succeeded" for r in rows.values()), {
        i: (r.state, r.error) for i, r in rows.items() if r.state != "succeeded"
    }
    # None run twice: one lease each, one start of the experiment each, no lease left.
    assert [i for i, r in rows.items() if r.attempts != 1] == []
    assert [i for i in ids if len(runs(settings, i)) != 1] == []
    assert leases_of(stores, ids) == []
    # The capped project never held more than one GPU: its intervals do not overlap.
    capped = sorted(
        (_aware(r.leased_at), _aware(r.finished_at))
        for r in rows.values()
        if r.project_id == capped_id
    )
    overlaps = sum(nxt[0] < prev[1] for prev, nxt in zip(capped, capped[1:], strict=False))
    assert overlaps == 0
    # ...while the two GPUs did run jobs at the same time (the cap is what kept it apart).
    everything = sorted((_aware(r.leased_at), _aware(r.finished_at)) for r in rows.values())
    parallel = sum(nxt[0] < prev[1] for prev, nxt in zip(everything, everything[1:], strict=False))
    assert parallel > 0
    # Both workers took jobs, and the uncapped project used the second GPU.
    by_worker = {}
    for r in rows.values():
        key = (r.worker or "").split("-")[2]  # gpu-cpu-<device>-<pid>@host
        by_worker[key] = by_worker.get(key, 0) + 1
    assert set(by_worker) == {"0", "1"}, by_worker

    counts = tally(settings, rows)
    assert counts["lost"] == 0 and counts["duplicated"] == 0
    figures[f"load[{variant(backend.name, settings)}]"] = {
        **counts,
        "gpu_workers": 2,
        "job_sleep_s": SLEEP_S,
        "capped_project_jobs": len(capped),
        "capped_project_budget_concurrent_gpus": 1,
        "capped_project_overlaps": overlaps,
        "overlapping_job_pairs_all_projects": parallel,
        "jobs_by_device": by_worker,
        "submit_s": round(submitted_s, 1),
        "wall_s": round(wall_s, 1),
        "jobs_per_s": round(len(ids) / wall_s, 2),
    }


CYCLES = int(os.environ.get("AUTOPILOT_RELIABILITY_LOAD_CYCLES", "500"))


def _cycles_settled(stores: Stores, ids: list[int]) -> int:
    with stores.ops_session() as session:
        return int(
            session.scalar(
                select(func.count())
                .select_from(Cycle)
                .where(
                    Cycle.id.in_(ids),
                    Cycle.state.not_in((*states.LIVE, "deferred_budget")),
                )
            )
            or 0
        )


@pytest.mark.timeout(CYCLES * 3 + 300)
def test_cycles_queued_against_two_gpu_workers(
    workers: Workers, stores: Stores, tmp_path: Path, backend: Backend, figures: dict[str, Any]
) -> None:
    """Whole cycles (plan, prepare, run, analyse, commit, publish) triggered at once: each
    reaches review with one job run once and one pull request; the budgets hold (cycles of
    the capped project wait as `deferred_budget` and resume, never overlapping on the GPU)."""
    production_variant_only(backend.name)
    workers.settings = workers.settings.model_copy(
        update={
            "lease_ttl_s": 30.0,
            "doorbell_stale_s": 60.0,
            "reaper_interval_s": 5.0,
            "max_live_cycles_per_project": CYCLES,
            # Cycles of the capped project wait as deferred_budget while its GPU is in use;
            # beat's schedule tick resumes them (every 60 s in production).
            "schedule_tick_s": 2.0,
        }
    )
    settings = workers.settings
    capped_repo, free_repo = make_repo(tmp_path, "cyc-capped"), make_repo(tmp_path, "cyc-free")
    capped_id = ensure_project(stores, capped_repo, budget_concurrent_gpus=1)
    ensure_project(stores, free_repo)

    workers.start("control", "control", "--beat")
    workers.start("gpu0", "gpu", "--kind", "cpu", "--device", "0")
    workers.start("gpu1", "gpu", "--kind", "cpu", "--device", "1")
    began = time.monotonic()
    with stores.ops_session() as session:
        ids = []
        for i in range(CYCLES):
            repo = (capped_repo, free_repo)[i % 2]
            cycle, created = cycle_service.create(
                session,
                cycle_service.Trigger(
                    project=repo.name,
                    experiment="probe",
                    parameters={"sleep_s": SLEEP_S, "grandchild": 0},
                    trigger="load-test",
                ),
                max_live=CYCLES,
            )
            assert created
            ids.append(cycle.id)
    for cycle_id in ids:
        broker.ring_advance(settings, cycle_id)
    submitted_s = time.monotonic() - began

    wait_for(
        lambda: _cycles_settled(stores, ids) == len(ids), timeout=CYCLES * 3 + 120, interval=1.0
    )
    wall_s = time.monotonic() - began
    with stores.ops_session() as session:
        rows = session.scalars(select(Cycle).where(Cycle.id.in_(ids))).all()
        states = {c.id: (c.state, c.error) for c in rows}
        job_ids = list(session.scalars(select(Job.id).where(Job.cycle_id.in_(ids))).all())
        pr_heads = session.execute(
            select(PullRequestRow.head).where(
                PullRequestRow.project.in_((capped_repo.name, free_repo.name))
            )
        ).all()
        pr_numbers = {(c.project_id, c.pr_number) for c in rows}
    assert {s for s, _ in states.values()} == {"awaiting_review"}, {
        i: s for i, s in states.items() if s[0] != "awaiting_review"
    }
    # One job per cycle, run once; one pull request per cycle, each on its own branch.
    assert len(job_ids) == len(set(job_ids)) == len(ids)
    jobs_by_id = job_rows(stores, job_ids)
    assert [i for i, r in jobs_by_id.items() if r.attempts != 1] == []
    # The probe appends its pid to runs.txt beside its working tree; cycles' worktrees share
    # parents, so count the starts over those files: exactly one per job. (Pids are not
    # unique over a run this long: the kernel reuses them.)
    run_files = {Path(r.workdir or "").parent / "runs.txt" for r in jobs_by_id.values()}
    starts = [pid for f in run_files for pid in f.read_text().split()]
    assert len(starts) == len(ids)
    assert len(pr_heads) == len({h for (h,) in pr_heads}) == len(ids)
    assert len(pr_numbers) == len(ids) and None not in {n for _, n in pr_numbers}
    capped = sorted(
        (_aware(r.leased_at), _aware(r.finished_at))
        for r in jobs_by_id.values()
        if r.project_id == capped_id
    )
    overlaps = sum(nxt[0] < prev[1] for prev, nxt in zip(capped, capped[1:], strict=False))
    assert overlaps == 0
    lost = sum(r.state != "succeeded" for r in jobs_by_id.values())
    duplicated = len(starts) - sum(r.attempts for r in jobs_by_id.values())
    assert lost == 0 and duplicated == 0
    figures[f"load_cycles[{variant(backend.name, settings)}]"] = {
        "cycles": len(ids),
        "awaiting_review": len(ids),
        "pull_requests": len(pr_heads),
        "jobs": len(jobs_by_id),
        "experiment_starts": len(starts),
        "lost": lost,
        "duplicated": duplicated,
        "gpu_workers": 2,
        "capped_project_overlaps": overlaps,
        "submit_s": round(submitted_s, 1),
        "wall_s": round(wall_s, 1),
        "cycles_per_s": round(len(ids) / wall_s, 2),
    }
