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
Goal: median gap <= baseline + 50 ms, duty cycle >= 0.95.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import git  # noqa: E402
from celery import Celery  # noqa: E402
from kombu import Queue  # type: ignore[attr-defined]  # noqa: E402
from sqlalchemy import create_engine, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from app import broker, migrate  # noqa: E402
from app.db import Stores  # noqa: E402
from app.jobs import service as jobs  # noqa: E402
from app.jobs.models import Job  # noqa: E402
from app.projects import config as project_config  # noqa: E402
from app.projects import service as ops  # noqa: E402
from app.projects.schemas import ProjectCreate  # noqa: E402
from app.settings import Settings  # noqa: E402

GAP_MARGIN_S = 0.050
DUTY_GOAL = 0.95
NOOP = "bench.noop"
NOOP_QUEUE = "bench.noop"

USER_MODULE = """\
import json, os, socket, time
_s = socket.socket(socket.AF_UNIX)
_s.connect(os.environ["AUTOPILOT_EVENTS"])
_s.sendall(json.dumps({"type": "started", "at": time.time()}).encode() + b"\\n")
_s.close()
import time
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
time.sleep(spec["parameters"]["sleep_s"])
json.dump({"status": "ok"}, open(os.environ["AUTOPILOT_RESULT"], "w"))
"""

CONFIG = """
[project]
name = "handoff"
gpu_kind = "cpu"
python_requirements = []

[experiments.sleep]
entry = "hbench.main"
time_limit_s = 60

[experiments.sleep.parameters]
sleep_s = [0.5, 0.1]
"""

T = TypeVar("T")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def wait_for(condition: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"handoff bench: timed out waiting for {what}")
        time.sleep(0.05)


def make_repo(root: Path) -> Path:
    repo_dir = root / "handoff"
    (repo_dir / "hbench").mkdir(parents=True)
    (repo_dir / "hbench" / "__init__.py").write_text("")
    (repo_dir / "hbench" / "main.py").write_text(textwrap.dedent(USER_MODULE))
    (repo_dir / "autopilot.toml").write_text(CONFIG)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["hbench/__init__.py", "hbench/main.py", "autopilot.toml"])
    actor = git.Actor("bench", "bench@example.invalid")
    repo.index.commit("handoff bench", author=actor, committer=actor)
    return repo_dir


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env.update(
        {
            "AUTOPILOT_STATE_DIR": str(settings.state_dir),
            "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
            "AUTOPILOT_OPS_URL": settings.ops_database_url,
            "AUTOPILOT_BROKER_URL": settings.broker_url,
            "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": str(settings.venv_system_site_packages).lower(),
            "AUTOPILOT_GPU_SPARE_INTERPRETER": str(settings.gpu_spare_interpreter).lower(),
            "PYTHONPATH": str(ROOT),
        }
    )
    return env


class Procs:
    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings, self.logs = settings, logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs.append(
            subprocess.Popen(
                argv,
                env=worker_env(self.settings),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.settings.state_dir,
                start_new_session=True,
            )
        )

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


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
    return round(statistics.median(values) * 1000, 1)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


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
        )
        migrate.upgrade(settings)
        stores = Stores.from_settings(settings)
        procs = Procs(settings, work / "logs")
        try:
            return _measure(args, work, settings, stores, procs)
        finally:
            procs.stop()
            stores.dispose()


def _measure(
    args: argparse.Namespace, work: Path, settings: Settings, stores: Stores, procs: Procs
) -> dict[str, Any]:
    if settings.broker_url.startswith("redis"):
        import redis

        client = redis.Redis.from_url(settings.broker_url)
        for queue in ("control", "prepare", "gpu.cpu", NOOP_QUEUE):
            client.delete(queue)  # leftovers of an earlier run are not this run's doorbells
    repo = make_repo(work)
    cli = [sys.executable, "-m", "workers.cli", "worker"]
    procs.start("control", [*cli, "control", "--loglevel", "WARNING"])
    procs.start(
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
        cfg = project_config.load_from_repo(str(repo), "main")
        ids = [
            jobs.submit(session, settings, project, cfg, "sleep", {"sleep_s": args.job_s}).id
            for _ in range(n)
        ]
    for job_id in ids:
        broker.ring_prepare(settings, job_id)

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
    procs.start("gpu", [*cli, "gpu", "--kind", "cpu", "--device", "0", "--loglevel", "WARNING"])

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
        duty = jobs.duty_cycle(rows)
    bad = [r for r in rows if r.state != "succeeded"]
    if bad:
        raise SystemExit(f"handoff bench: job {bad[0].id} {bad[0].state}: {bad[0].error}")
    gaps = [r.idle_gap_s for r in rows if r.idle_gap_s is not None]
    # Where the gap goes: previous finish -> lease taken -> process spawned -> first line.
    release_lease, spawn, interp = [], [], []
    for prev, row in zip(rows, rows[1:], strict=False):
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
        "jobs": n,
        "job_s": args.job_s,
        "gaps_measured": len(gaps),
        "median_gap_ms": gap_ms,
        "p95_ms": round(p95(gaps) * 1000, 1),
        "max_gap_ms": round(max(gaps) * 1000, 1),
        "duty_cycle": round(duty or 0.0, 4),
        "wall_duty_cycle": round(n * args.job_s / wall, 4),
        "baseline": {
            "what": "no-op Celery task round trip, same broker, solo worker",
            "median_ms": base_ms,
            "p95_ms": round(p95(trips) * 1000, 1),
            "samples": len(trips),
        },
        "ratio": round(gap_ms / base_ms, 3),
        "goal": {
            "median_gap_max_ms": round(base_ms + GAP_MARGIN_S * 1000, 1),
            "duty_cycle_min": DUTY_GOAL,
            "met": gap_ms <= base_ms + GAP_MARGIN_S * 1000 and (duty or 0.0) >= DUTY_GOAL,
        },
        "breakdown_median_ms": {
            "finish_to_lease": median_ms(release_lease),
            "lease_to_spawn": median_ms(spawn),
            "spawn_to_first_line": median_ms(interp),
            "busy_first_line_to_finish": median_ms(busy),
        },
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "date": datetime.now(UTC).date().isoformat(),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="15 jobs instead of 50")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--broker", default="filesystem://", help="filesystem:// or redis://...")
    ap.add_argument("--ops-url", default=None, help="PostgreSQL server URL; default SQLite")
    ap.add_argument(
        "--no-spare",
        action="store_true",
        help="start every job cold (no parked interpreter): the ablation",
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
    if args.json:
        print(json.dumps(result))
        return
    for key, value in result.items():
        print(f"{key:22} {value}")


if __name__ == "__main__":
    main()
