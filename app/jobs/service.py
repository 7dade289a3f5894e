"""The GPU handoff queue's operations: submit, lease, heartbeat, finish, cancel, and the choice
of the next job under the two budgets. The ops DB is the truth; a broker message is only a
doorbell. Each state change goes through `lifecycle.move` (the reaper's, `reaping.py`, too).
Every function here runs inside the caller's transaction and only flushes.
"""

from __future__ import annotations

import logging
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from autopilot_harness import sequential
from sqlalchemy.orm import Session

from app.clock import aware, utcnow
from app.errors import AutopilotError, Conflict, InvalidInput, NotFound
from app.jobs import gangs, lifecycle
from app.jobs import repository as repo
from app.jobs.choosing import choose_next
from app.jobs.lifecycle import FINISHED, WAITING, JobState
from app.jobs.models import Job, Lease, Worker
from app.projects.config import Experiment, ProjectConfig
from app.projects.models import Project
from app.settings import Settings

log = logging.getLogger(__name__)


class JobNotFound(NotFound):
    slug = "job-not-found"
    title = "Job not found"


class JobFinished(Conflict):
    slug, title = "job-finished", "Job already finished"


class TooManyJobs(AutopilotError):
    status, slug, title = 429, "too-many-jobs", "Too many unfinished jobs"


class LeaseLost(Exception):
    """This worker no longer holds the job's lease (it expired and the job moved on)."""


def queue_for(settings: Settings, kind: str) -> str:
    if kind not in settings.gpu_kinds:
        raise InvalidInput(
            f"unknown GPU kind {kind!r}; configured kinds: {', '.join(settings.gpu_kinds)} "
            "(AUTOPILOT_GPU_KINDS)"
        )
    return f"gpu.{kind}"


def parse_queue(settings: Settings, queue: str) -> str:
    kind = queue.removeprefix("gpu.")
    if not queue.startswith("gpu.") or kind not in settings.gpu_kinds:
        raise InvalidInput(
            f"unknown queue {queue!r}; expected one of "
            f"{', '.join('gpu.' + k for k in settings.gpu_kinds)}"
        )
    return queue


#: A job's seed is drawn from [0, SEED_RANGE): an int every JSON reader and the harness take.
SEED_RANGE = 2**31


@dataclass(frozen=True)
class JobSource:
    """The code a job runs, as a commit a GPU host can fetch: the URL (the forge), the branch
    that holds it, the head to run and the base it is compared with."""

    repo: str
    ref: str
    head_sha: str
    base_sha: str | None = None


def submit(
    session: Session,
    settings: Settings,
    project: Project,
    config: ProjectConfig,
    experiment: str,
    parameters: dict[str, Any],
    *,
    queue: str | None = None,
    cycle_id: int | None = None,
    seed: int | None = None,
    source: JobSource | None = None,
) -> Job:
    """Validate against the project's declared experiments and space, then record the job.

    `seed` (the experiment's inputs, the order of its runs and the judge's bootstraps) is drawn
    here, by the control plane, unless a caller fixes it: a candidate cannot know it before its
    job runs, so it cannot prepare for the inputs or the schedule it will meet."""
    declared = config.experiment(experiment)
    full = declared.check_parameters(parameters)
    queue = parse_queue(settings, queue) if queue else queue_for(settings, project.gpu_kind)
    if declared.time_limit_s > settings.max_job_time_limit_s:
        raise InvalidInput(
            f"experiment {experiment!r} declares time_limit_s={declared.time_limit_s:g}, above "
            f"the per-job limit {settings.max_job_time_limit_s:g} (AUTOPILOT_MAX_JOB_TIME_LIMIT_S)"
        )
    spec = {
        "experiment": experiment,
        "parameters": full,
        "device": "cpu" if queue == "gpu.cpu" else "cuda",
        "seed": secrets.randbelow(SEED_RANGE) if seed is None else seed,
        "tolerance": declared.tolerance.model_dump(),
        "gpus": declared.gpus,
        "longest_s": declared.time_limit_s,  # the longest it holds its GPUs: one run, or...
    }
    if declared.kind == "command":
        spec.update(command_spec(declared))
    elif source is not None and source.base_sha and source.head_sha != source.base_sha:
        # The cycle changed code: the entry runs at base and at head too (docs/design.md,
        # "Experiment kinds"), and the verdict is head against base.
        spec["head_vs_base"] = True
        spec.update(stopping_spec(declared))
    if declared.kind == "command" or spec.get("head_vs_base"):  # ...every run of both arms
        spec["longest_s"] = declared.longest_job_s
    now = utcnow()
    job = Job(
        cycle_id=cycle_id,
        project_id=project.id,
        experiment=experiment,
        parameters=full,
        spec=spec,
        queue=queue,
        state=JobState.QUEUED.value,  # born waiting: a constructor, not a move
        max_attempts=settings.job_max_attempts,
        time_limit_s=declared.time_limit_s,
        gpus=declared.gpus,
        order_key=now,
        submitted_at=now,
    )
    if source is not None:
        job.repo, job.ref = source.repo, source.ref
        job.head_sha, job.base_sha = source.head_sha, source.base_sha
    repo.add(session, job)
    session.flush()
    return job


def command_spec(declared: Experiment) -> dict[str, Any]:
    """What a command job's spec adds: the baseline arm's parameters (the experiment's
    defaults), and how the control plane judges it (direction, the check gate), written here
    from the config so that the judge never takes them from the result."""
    check = None
    if declared.check_source is not None:
        check = {
            "direction": declared.check_direction,
            "tolerance": declared.check_tolerance,
            "source": declared.check_source,
        }
    return {
        "kind": "command",
        "baseline_parameters": dict(declared.defaults),
        "metric": declared.metric,
        "direction": declared.direction,
        "time_metric": declared.time_metric,
        # Where each number comes from: the judge trusts only the control plane's copy
        # (docs/design.md, "Where a number comes from").
        "metric_source": declared.metric_source,
        "check": check,
        **stopping_spec(declared),
    }


def stopping_spec(declared: Experiment) -> dict[str, Any]:
    """The stopping rule of a job's blocks, written by the control plane so that the runner
    stops by it and the judge checks the stop by it (docs/design.md, "Sequential verdicts");
    nothing for a fixed design."""
    if declared.stopping != "sequential":
        return {}
    rule = sequential.Rule(
        max_blocks=declared.repeats,
        min_blocks=declared.min_blocks,
        margin=declared.equivalence_margin,
    )
    return {"sequential": rule.as_dict()}


def get(session: Session, job_id: int) -> Job:
    job = repo.get(session, job_id)
    if job is None:
        raise JobNotFound(f"no job {job_id}; list jobs with GET /api/v1/jobs")
    return job


def fail_unstarted(session: Session, job_id: int, error: str) -> None:
    """Fail a job that never started (no host could prepare it); one that did is left alone."""
    job = repo.get(session, job_id)
    if job is not None and job.state == JobState.QUEUED:
        lifecycle.move(job, JobState.FAILED, error=error, finished_at=utcnow())
        session.flush()


def first_waiting(session: Session, queue: str, host: str | None = None) -> Job | None:
    """The prepared job first in line on `queue` (on `host`), no lock: what a worker may get
    ready for."""
    return repo.first_waiting(session, queue, host)


#: May an idle worker take over this job, reserved by another worker of its host (the host's
#: claim on it, `workers/gpu/claims.py`)?
MayTake = Callable[[Job, Lease], bool]


def lease_next(
    session: Session,
    settings: Settings,
    *,
    queue: str,
    worker: str,
    device: str,
    host: str | None = None,
    alive: gangs.Alive | None = None,
    may_take: MayTake | None = None,
) -> Job | None:
    """Lease the oldest prepared job of `queue` that fits both budgets, in one transaction.

    Whatever doorbell woke the worker, it takes the job first in the global submission order;
    a duplicate doorbell finds nothing. A job of several GPUs comes with its members' seats
    (`gangs.py`; `alive`: which workers of the host are up). A seated worker takes nothing.

    A job that a busy worker of the same host has reserved (`reservations.py`) keeps its place
    in line for an idle one: a reservation only saves its worker a round trip at its current
    job's end, and must never leave a job waiting while a GPU is idle (nor delay a job of
    several GPUs behind it). The idle worker takes it over when `may_take` says its reserver
    has not started it (decided on the host, off the reserver's idle gap); the reserver then
    gives it back when its own job ends. Without `may_take`, reserved jobs are passed over.
    """
    host = host or socket.gethostname()
    repo.lock_leasing(session)
    now = utcnow()
    if gangs.seat_of(session, worker) is not None:
        session.flush()
        return None
    room = gangs.room_on(session, queue=queue, host=host, worker=worker, alive=alive)
    passed: set[int] = set()
    while True:
        job = choose_next(
            session, settings, queue=queue, host=host, room=room, reserved_too=True, skip=passed
        )
        if job is None or job.state != JobState.RESERVED:
            reservation = None
            break
        reservation = repo.lease_of(session, job.id)
        if reservation is None:
            break
        if reservation.host == host and may_take is not None and may_take(job, reservation):
            break
        passed.add(job.id)  # its reserver's, or about to start there
    # Claimed under the lock, and only while still queued (or reserved: taken over).
    if job is None or not repo.claim(session, job.id, worker, now):
        session.flush()
        return None
    if reservation is not None:
        log.info("job %s: reserved by %s, taken by idle %s", job.id, reservation.worker, worker)
        repo.delete(session, reservation)
        session.flush()
    repo.refresh(session, job)
    if job.gpus > 1:
        device = gangs.take_seats(session, job, room(), host=host, leader_device=device)
    add_lease(session, settings, job, worker=worker, host=host, device=device)
    return job


def add_lease(
    session: Session, settings: Settings, job: Job, *, worker: str, host: str, device: str
) -> Lease:
    """The lease row of a claimed (or reserved) job, and where it runs: the leasing host's own
    export and venv."""
    prepared = repo.preparation(session, job.id, host)
    if prepared is not None:
        job.take_preparation(prepared)
    now = utcnow()
    lease = Lease(
        job_id=job.id,
        worker=worker,
        host=host,
        device=device,
        heartbeat_at=now,
        expires_at=now + timedelta(seconds=settings.lease_ttl_s),
    )
    repo.add(session, lease)
    session.flush()
    return lease


def _own_lease(session: Session, job_id: int, worker: str) -> Lease:
    lease = repo.lease_of(session, job_id)
    if lease is None or lease.worker != worker:
        raise LeaseLost(f"job {job_id} is no longer leased by {worker}")
    return lease


def mark_running(session: Session, job_id: int, worker: str, pid: int, pgid: int) -> None:
    lease = _own_lease(session, job_id, worker)
    lease.pid, lease.pgid = pid, pgid
    job = get(session, job_id)
    if job.state == JobState.RUNNING:
        # A reserved command job runs from its hand-over (`reservations.start_reserved`); its
        # first run starts now: its start is that run's, as a leased job's is.
        job.started_at = utcnow()
    else:
        lifecycle.move(job, JobState.RUNNING, started_at=utcnow())
    session.flush()


def mark_first_line(session: Session, job_id: int, worker: str, at: datetime) -> None:
    """The job's first line of user code ran: the end of the GPU's idle gap (recorded only by
    the worker that holds the job)."""
    lease = repo.lease_of(session, job_id)
    if lease is None or lease.worker != worker:
        return
    job = get(session, job_id)
    job.first_line_at = at
    row = repo.get_worker(session, worker)
    last = aware(row.last_job_finished_at) if row else None
    prepared = aware(job.prepared_at)
    # Only a gap with demand waiting counts: the job was ready before the last one ended.
    if last is not None and prepared is not None and prepared <= last:
        job.idle_gap_s = max(0.0, (at - last).total_seconds())
    session.flush()


def heartbeat(
    session: Session, settings: Settings, job_id: int, worker: str, log_tail: str | None = None
) -> bool:
    """Renew the lease (and keep the log's tail, which the control host shows while the job
    runs elsewhere); True when someone asked to cancel the job."""
    lease = _own_lease(session, job_id, worker)
    now = utcnow()
    lease.heartbeat_at, lease.expires_at = now, now + timedelta(seconds=settings.lease_ttl_s)
    seen = repo.get_worker(session, worker)
    if seen is not None:
        seen.last_seen = now
    job = get(session, job_id)
    if log_tail is not None:
        job.log_tail = log_tail
    session.flush()
    return job.cancel_requested_at is not None


#: What a worker reports of a run it ended (`lifecycle.Outcome`), by the name `finish` takes it.
JobOutcome = lifecycle.Outcome


def finish(session: Session, job_id: int, worker: str, outcome: JobOutcome) -> Job:
    """Record the outcome of a run, whatever ended it, and release the lease: the one way a
    worker ends a job. Only the lease holder may: exactly one outcome. The worker says what
    ended the run; the lifecycle says the state (`lifecycle.state_after`)."""
    lease = _own_lease(session, job_id, worker)
    job = get(session, job_id)
    if job.state in FINISHED:  # cancelled while reserved: that stands, whatever ran meanwhile
        repo.delete(session, lease)
        session.flush()
        return job
    lifecycle.move(
        job,
        lifecycle.state_after(outcome.ended),
        exit_code=outcome.exit_code,
        error=outcome.error,
        result=outcome.result,
        result_path=outcome.result_path,
        log_path=outcome.log_path,
        gpu_seconds=outcome.gpu_seconds,
        finished_at=outcome.finished_at,
    )
    if outcome.log_tail is not None:
        job.log_tail = outcome.log_tail
    repo.delete(session, lease)
    if job.gpus > 1:  # its members go free with it
        gangs.release(session, job_id)
    row = repo.get_worker(session, worker)
    if row is not None:
        row.current_job_id, row.last_job_finished_at = None, outcome.finished_at
    session.flush()
    return job


def cancel(session: Session, job_id: int, by: str) -> Job:
    """A waiting job (queued or reserved) is cancelled at once; a running one is told through
    the DB (heartbeat). A reservation cancelled so is its worker's to drop (it renews it no
    more, and its start is refused)."""
    job = get(session, job_id)
    if job.state in FINISHED:
        raise JobFinished(f"job {job_id} already {job.state}; nothing to cancel")
    now = utcnow()
    job.cancel_requested_at, job.cancelled_by = job.cancel_requested_at or now, by
    if job.state in WAITING:
        lifecycle.move(job, JobState.CANCELLED, finished_at=now)
    session.flush()
    return job


def register_worker(
    session: Session,
    name: str,
    kind: str,
    devices: str,
    host: str | None = None,
    pid: int | None = None,
) -> Worker:
    row = repo.get_worker(session, name)
    now = utcnow()
    if row is None:
        row = Worker(name=name, kind=kind, devices=devices, host=host or socket.gethostname())
        repo.add(session, row)
    row.kind, row.devices, row.last_seen, row.started_at = kind, devices, now, now
    row.pid = pid
    session.flush()
    return row


def set_current_job(session: Session, worker: str, job_id: int | None) -> None:
    row = repo.get_worker(session, worker)
    if row is not None:
        row.current_job_id, row.last_seen = job_id, utcnow()
        session.flush()


def cycle_of(session: Session, job_id: int) -> int | None:
    """The cycle the job belongs to; None for a standalone (or unknown) job."""
    job = repo.get(session, job_id)
    return job.cycle_id if job else None


def list_jobs(session: Session, **filters: Any) -> Sequence[Job]:
    return repo.list_jobs(session, **filters)


def count_jobs(session: Session, **filters: Any) -> int:
    return repo.count_jobs(session, **filters)


def list_workers(session: Session) -> Sequence[Worker]:
    return repo.list_workers(session)


# -- asked by cycles ----


def kept_among(session: Session, ids: Sequence[int], before: datetime) -> set[int]:
    """Of these jobs, those unfinished or finished after `before` (a GPU host's tree sweep)."""
    return repo.kept_among(session, ids, before)


def for_cycle(session: Session, cycle_id: int) -> Job | None:
    """The job a cycle submitted, if it got that far (`Job.cycle_id` says whose it is)."""
    return repo.for_cycle(session, cycle_id)


def ids_for_cycles(session: Session, cycle_ids: Sequence[int]) -> dict[int, int]:
    """Cycle id → its job's id, for the given cycles that have a job."""
    return repo.ids_for_cycles(session, cycle_ids)


def cycles_whose_job_ended(
    session: Session, cycle_ids: Sequence[int], older_than: datetime
) -> list[tuple[int, datetime]]:
    """Of these cycles, those whose job finished before `older_than`, with when it did."""
    return repo.ended_before_for_cycles(session, cycle_ids, older_than)
