"""GPU handoff: the idle gap between one job's end and the next job's first line of user code.

50 back-to-back jobs of 0.5 s each on one GPU worker (`autopilot worker gpu --kind cpu`, a real
subprocess, with `autopilot worker control` preparing them). Every job is submitted and
prepared before the GPU worker starts, so the gap measures the handoff, not preparation. The
Job rows record `finished_at`, `first_line_at` and `idle_gap_s`. Baseline, in the same run and
on the same broker: the round trip of a no-op Celery task to its own solo worker (send, run,
result back), measured before and after the jobs.

    python bench/handoff.py [--quick] [--json] [--broker redis://127.0.0.1:6379/1]
                            [--ops-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

The job venv is built as in production (isolated; the harness and numpy are pip-installed once,
before measuring); --system-site-packages builds it over the service's packages instead.
With --ops-url, a fresh database is created next to the one named and dropped afterwards.
Goal: median gap <= 5 ms and duty cycle >= 0.99. --no-reserve and --no-spare are the
ablations (no reservation of the next job; every job started cold).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from _common import (
    ROOT,
    Services,
    autopilot_env,
    bench_parser,
    emit,
    machine,
    make_probe_repo,
    percentile,
    probe_config,
)
from celery import Celery
from kombu import Queue  # type: ignore[attr-defined]
from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import make_url

from app import broker, migrate
from app.db import Stores
from app.jobs import figures
from app.jobs import service as jobs
from app.jobs.models import Job
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings
from workers import prepare

GAP_GOAL_MS = 5.0
DUTY_GOAL = 0.99
NOOP = "bench.noop"
NOOP_QUEUE = "bench.noop"

USER_MODULE = """\
import time; _FIRST_LINE = time.time()
import json, os, socket
_s = socket.socket(socket.AF_UNIX)
_s.connect(os.environ["AUTOPILOT_EVENTS"])
_s.sendall(json.dumps({"type": "started", "at": _FIRST_LINE}).encode() + b"\\n")
_s.close()
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
time.sleep(spec["parameters"]["sleep_s"])
json.dump({"status": "ok"}, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""

CONFIG = probe_config("handoff", "sleep", "hbench.main", 60, {"sleep_s": [0.5, 0.1]})

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"handoff bench: timed out waiting for {what}")
        time.sleep(0.05)


@contextmanager
def ops_database(url: str | None, state: Path) -> Iterator[str]:
    """SQLite in the state dir, or a fresh PostgreSQL database beside `url`, dropped after."""
    if url is None:
        yield f"sqlite:///{state / 'ops.db'}"
        return
    base = make_url(url)
    name = f"ap_bench_handoff_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def worker_env(settings: Settings) -> dict[str, str]:
    return autopilot_env(
        {
            "AUTOPILOT_STATE_DIR": str(settings.state_dir),
            "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
            "AUTOPILOT_OPS_URL": settings.ops_database_url,
            "AUTOPILOT_BROKER_URL": settings.broker_url,
            "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": str(settings.venv_system_site_packages).lower(),
            "AUTOPILOT_GPU_SPARE_INTERPRETER": str(settings.gpu_spare_interpreter).lower(),
            "AUTOPILOT_GPU_RESERVE_NEXT": str(settings.gpu_reserve_next).lower(),
            "AUTOPILOT_SANDBOX": settings.sandbox,
            "PYTHONPATH": str(ROOT),
        }
    )


# -- the baseline: a no-op task's round trip on the same broker -------------------------------


def baseline_app(settings: Settings) -> Celery:
    app = Celery("handoff-baseline")
    app.conf.update(broker.celery_config(settings))
    backend = (
        settings.broker_url
        if settings.broker_url.startswith("redis")
        else f"file://{settings.state_dir.absolute() / 'results'}"
    )
    (settings.state_dir.absolute() / "results").mkdir(parents=True, exist_ok=True)
    app.conf.update(
        task_queues=[Queue(NOOP_QUEUE)],
        task_default_queue=NOOP_QUEUE,
        task_routes={},
        task_ignore_result=False,
        result_backend=backend,
        beat_schedule={},
    )
    app.task(name=NOOP)(_noop)
    return app


def _noop() -> int:
    return 0


def round_trips(app: Celery, count: int) -> list[float]:
    times = []
    for _ in range(count):
        t0 = time.perf_counter()
        app.send_task(NOOP, queue=NOOP_QUEUE).get(timeout=30, interval=0.001)
        times.append(time.perf_counter() - t0)
    return times


def run_baseline_worker(settings: Settings) -> None:
    baseline_app(settings).worker_main(
        [
            "worker",
            "-Q",
            NOOP_QUEUE,
            "-P",
            "solo",
            "-c",
            "1",
            "-n",
            f"noop-{os.getpid()}@bench",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ]
    )


# -- the measurement --------------------------------------------------------------------------


def median_ms(values: list[float]) -> float:
    """The median in ms (NaN-free: 0.0 when there is nothing to take it of)."""
    return round(statistics.median(values) * 1000, 1) if values else 0.0


RESERVED_LINE = "[launch] reserved while the previous job ran"


def _log_text(path: str | None) -> str:
    try:
        return Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return ""


def aware(value: datetime | None) -> datetime:
    assert value is not None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    state = work / "state"
    state.mkdir()
    (work / "logs").mkdir()
    with ops_database(args.ops_url, state) as ops_url:
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            state_dir=state,
            ops_url=ops_url,
            broker_url=args.broker,
            venv_system_site_packages=args.system_site_packages,
            gpu_spare_interpreter=not args.no_spare,
            gpu_reserve_next=not args.no_reserve,
            sandbox=args.sandbox,
        )
        migrate.upgrade(settings)
        stores = Stores.from_settings(settings)
        services = Services(worker_env(settings), work / "logs", settings.state_dir)
        try:
            return _measure(args, work, settings, stores, services)
        finally:
            services.stop_all()
            stores.dispose()


def _measure(
    args: argparse.Namespace, work: Path, settings: Settings, stores: Stores, services: Services
) -> dict[str, Any]:
    if settings.broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(settings.broker_url)
        for queue in ("control", "gpu.cpu", NOOP_QUEUE):
            client.delete(queue)  # leftovers of an earlier run are not this run's doorbells
    repo = make_probe_repo(work, "handoff", "hbench", USER_MODULE, CONFIG, "handoff bench")
    services.cli("control", "worker", "control", "--loglevel", "WARNING")
    services.start(
        "noop",
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--baseline-worker",
            "--broker",
            settings.broker_url,
            "--state",
            str(settings.state_dir),
        ],
    )
    # Everything submitted and prepared before the GPU worker starts.
    n = args.jobs or (15 if args.quick else 50)
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name="handoff", repo_url=str(repo)))
        cfg = project_config.load(repo)
        ids = [
            jobs.submit(session, settings, project, cfg, "sleep", {"sleep_s": args.job_s}).id
            for _ in range(n)
        ]
    # Prepared on this host (the GPU worker's, same state dir), as its preparer would while a
    # GPU runs: the gap measured is the handoff between prepared jobs, not the preparation.
    prepare.prepare_ahead(stores, settings, "gpu.cpu", want=n)

    def prepared() -> bool:
        with stores.ops_session() as session:
            rows = session.scalars(select(Job).where(Job.id.in_(ids))).all()
            failed = [r for r in rows if r.state != "queued"]
            if failed:
                raise SystemExit(f"handoff bench: job {failed[0].id} {failed[0].error}")
            return all(r.prepared_at is not None for r in rows)

    wait_for(prepared, 600, "all jobs to be prepared")
    app = baseline_app(settings)
    round_trips(app, 5)  # warm-up: connections, the worker's first poll
    trips = round_trips(app, 20 if args.quick else 50)

    t0 = time.monotonic()
    services.cli(
        "gpu",
        "worker",
        "gpu",
        "--kind",
        "cpu",
        "--device",
        "0",
        "--loglevel",
        "WARNING",
        "--no-start-checks",  # no API here: the jobs are local, their logs wait in the outbox
    )

    def all_done() -> bool:
        with stores.ops_session() as session:
            rows = session.scalars(select(Job).where(Job.id.in_(ids))).all()
            return all(r.state in ("succeeded", "failed", "cancelled") for r in rows)

    wait_for(all_done, 60 + n * (args.job_s + 5), "the jobs to finish")
    wall = time.monotonic() - t0
    trips += round_trips(app, 20 if args.quick else 50)

    with stores.ops_session() as session:
        rows = list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.first_line_at)))
        for row in rows:
            session.expunge(row)
        duty = figures.duty_cycle(rows)
    bad = [r for r in rows if r.state != "succeeded"]
    if bad:
        raise SystemExit(f"handoff bench: job {bad[0].id} {bad[0].state}: {bad[0].error}")
    gaps = [r.idle_gap_s for r in rows if r.idle_gap_s is not None]
    # Jobs reserved while the one before ran (their start is recorded after their first line,
    # so the parts below are measured on the others only).
    reserved_ids = {r.id for r in rows if RESERVED_LINE in _log_text(r.log_path)}
    # Where the gap goes: previous finish -> lease taken -> process spawned -> first line.
    release_lease, spawn, interp = [], [], []
    for prev, row in zip(rows, rows[1:], strict=False):
        if row.id in reserved_ids:
            continue
        end = aware(prev.finished_at)
        release_lease.append((aware(row.leased_at) - end).total_seconds())
        spawn.append((aware(row.started_at) - aware(row.leased_at)).total_seconds())
        interp.append((aware(row.first_line_at) - aware(row.started_at)).total_seconds())
    busy = [(aware(r.finished_at) - aware(r.first_line_at)).total_seconds() for r in rows]
    base_ms = median_ms(trips)
    gap_ms = median_ms(gaps)
    return {
        "benchmark": "handoff",
        "broker": settings.broker_url.split("://")[0],
        "ops_db": make_url(settings.ops_database_url).get_backend_name(),
        "venv": "system-site-packages" if settings.venv_system_site_packages else "isolated",
        "spare_interpreter": settings.gpu_spare_interpreter,
        "reserve_next": settings.gpu_reserve_next,
        "jobs": n,
        "job_s": args.job_s,
        "gaps_measured": len(gaps),
        "jobs_reserved": len(reserved_ids),
        "median_gap_ms": gap_ms,
        "p95_ms": round(percentile(gaps, 0.95) * 1000, 1),
        "max_gap_ms": round(max(gaps) * 1000, 1),
        "duty_cycle": round(duty or 0.0, 4),
        "wall_duty_cycle": round(n * args.job_s / wall, 4),
        "baseline": {
            "what": "no-op Celery task round trip, same broker, solo worker",
            "median_ms": base_ms,
            "p95_ms": round(percentile(trips, 0.95) * 1000, 1),
            "samples": len(trips),
        },
        "ratio": round(gap_ms / base_ms, 3),
        "goal": {
            "median_gap_max_ms": GAP_GOAL_MS,
            "duty_cycle_min": DUTY_GOAL,
            "met": gap_ms <= GAP_GOAL_MS and (duty or 0.0) >= DUTY_GOAL,
        },
        "breakdown_median_ms_of_jobs_not_reserved": {
            "finish_to_lease": median_ms(release_lease),
            "lease_to_spawn": median_ms(spawn),
            "spawn_to_first_line": median_ms(interp),
            "busy_first_line_to_finish": median_ms(busy),
        },
        "sandbox": settings.sandbox,
        "machine": machine("cpu", "cores", "python", "date"),
    }


def main() -> None:
    ap = bench_parser(__doc__, quick="15 jobs instead of 50")
    ap.add_argument("--broker", default="filesystem://", help="filesystem:// or redis://...")
    ap.add_argument("--ops-url", default=None, help="PostgreSQL server URL; default SQLite")
    ap.add_argument(
        "--no-spare",
        action="store_true",
        help="start every job cold (no parked interpreter): the ablation",
    )
    ap.add_argument(
        "--no-reserve",
        action="store_true",
        help="lease each job when the previous one ends (no reservation): the ablation",
    )
    ap.add_argument(
        "--sandbox",
        choices=("on", "off"),
        default="on",
        help="AUTOPILOT_SANDBOX of the GPU worker and of the preparation (default: on)",
    )
    ap.add_argument("--jobs", type=int, default=0, help="override the number of jobs")
    ap.add_argument("--job-s", type=float, default=0.5, help="each job's length")
    ap.add_argument(
        "--system-site-packages",
        action="store_true",
        help="build the job venv over the service's packages (offline machines; the default "
        "is production's isolated venv, which pip-installs the harness and numpy once)",
    )
    ap.add_argument("--baseline-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--state", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.baseline_worker:
        run_baseline_worker(
            Settings(
                _env_file=None,
                state_dir=Path(args.state),  # type: ignore[call-arg]
                broker_url=args.broker,
            )
        )
        return
    work = Path(tempfile.mkdtemp(prefix="ap-handoff-"))
    try:
        result = measure(args, work)
    finally:
        if os.environ.get("HANDOFF_KEEP"):
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    emit(result, args.json)


if __name__ == "__main__":
    main()
