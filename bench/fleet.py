"""Control-plane throughput with many GPU workers, on Redis + PostgreSQL.

Real processes: `python -m workers.cli serve` (the API), `worker control --beat` (the control
plane: every cycle step) and N `worker gpu --kind cpu --device i` (the GPU workers), with Redis
as the broker and PostgreSQL as both stores (a database of the bench's own, dropped after). The
research repo holds the probe experiment (bench/_common.py PROBE) sleeping `--job-s` seconds,
with a large parameter space, so the default sweep agent proposes a fresh point every cycle and
the experiments cost no CPU: the machine's cores measure the control plane.

Cycles are triggered over REST (`POST /api/v1/cycles`), keeping a backlog of unfinished cycles
(2 per worker, plus 4) so no GPU worker waits for a trigger. Two phases in one run, same job
length: 1 GPU worker, then N. Each phase discards a warm-up of settled cycles, then measures
`--cycles` per worker settled cycles (reaching `awaiting_review`):

- cycles_per_min: settled cycles over the window between the warm-up's last settlement and the
  window's last (Cycle.updated_at from the ops DB), times 60;
- scaling_efficiency: cycles_per_min at N over N x cycles_per_min at 1;
- per-step medians (CycleStep rows of the window's cycles), queue waits (trigger -> plan
  starts; job finished -> analyze starts), the GPU workers' busy fraction (job gpu_seconds
  over N x window);
- CPU seconds per process class over the window, from /proc (each service's process group,
  postgres, redis-server) and the machine's busy time, which shows where it saturates.

The per-project live-cycle cap (AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT) is lifted to 100000 and
no budgets are set: both would throttle the trigger, not the control plane.

    python bench/fleet.py [--quick] [--json] [--workers 16] [--job-s 2.5] [--cycles 10]
                          [--control-concurrency C] [--keep]

Goal: cycles_per_min >= 300 with 16 GPU workers, scaling_efficiency >= 0.8.

The job length decides which of the two a run can show. 16 workers of L-second jobs ask for at
most 16 x 60 / L cycles a minute: 300 needs L <= 3.2 s. The efficiency compares the rate with
that demand: with a control plane that serves C cycles a minute on this machine, it holds while
0.8 x 16 x 60 / L <= C, so L >= 768 / C (about 2.56 s at C = 300). The default, 2.5 s, asks
for ~380 cycles a minute (16 x 23.8): more than the goal, so the rate is what the control plane
serves, and the efficiency asks it for ~305. Longer jobs lower that demand towards the goal
itself (2.75 s: ~350 a minute, of which a control plane's queueing loses ~15%). With 1 s jobs
(demand ~930 a minute) the efficiency only restates that 2 cores cannot serve three times the
goal (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from _common import (
    PROBE,
    ROOT,
    Services,
    autopilot_env,
    bench_parser,
    emit,
    free_port,
    machine_line,
    make_probe_repo,
    new_token,
    probe_config,
    register_probe,
    today,
    ts,
    wait_http,
)
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

PROJECT = "fleet-probe"
GOAL_CYCLES_PER_MIN, GOAL_EFFICIENCY, GOAL_WORKERS = 300.0, 0.8, 16
# The sweep's space: K x J = 20,000 points, far more than any run settles, declared as two
# short lists (a 20,000-element list would make every read of autopilot.toml the cost).
K_POINTS, J_POINTS = 200, 100
POLL_S = 0.2
PHASE_TIMEOUT_S = 900.0
SETTLED = "awaiting_review"
ENDED = ("awaiting_review", "approved", "rejected", "skipped_repeat", "failed", "cancelled")
STEPS = ("planned", "preparing", "analyzing", "committing", "publishing")
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


# -- the stores ---------------------------------------------------------------------------------


@contextlib.contextmanager
def databases(prefix: str) -> Iterator[dict[str, str]]:
    """Fresh PostgreSQL databases `<prefix>_ops` and `<prefix>_memory`, dropped afterwards."""
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    names = {"ops": f"{prefix}_ops", "memory": f"{prefix}_memory"}
    base = PG_ADMIN.rsplit("/", 1)[0]
    try:
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield {role: f"{base}/{name}" for role, name in names.items()}
    finally:
        with admin.connect() as conn:
            for name in names.values():
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def flush_redis(url: str) -> None:
    import redis

    redis.Redis.from_url(url).flushdb()


# -- CPU from /proc -----------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: str) -> tuple[str, int, float, float] | None:
    """(comm, process group, its own CPU seconds, its reaped children's) of one process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    # fields[0] is state (field 3); utime..cstime are fields 14..17, pgrp field 5.
    own = (int(fields[11]) + int(fields[12])) / TICK
    children = (int(fields[13]) + int(fields[14])) / TICK
    return comm, int(fields[2]), own, children


def cpu_sample(groups: dict[int, str]) -> dict[str, float]:
    """CPU seconds so far per class: each service's process group, its Python apart from the
    children it started and reaped (git, experiments), postgres and redis-server by name, and
    the machine's busy and total time."""
    out: dict[str, float] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        stat = _stat(pid)
        if stat is None:
            continue
        comm, pgrp, own, children = stat
        name = groups.get(pgrp)
        if name is not None:
            out[name] = out.get(name, 0.0) + own
            out[f"{name}: children"] = out.get(f"{name}: children", 0.0) + children
            continue
        if comm.startswith("postgres"):
            name = "postgres (all databases)"
        elif comm.startswith("redis-server"):
            name = "redis"
        if name is not None:
            out[name] = out.get(name, 0.0) + own + children
    cpu_line = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    ticks = [int(v) for v in cpu_line]
    idle = ticks[3] + ticks[4]
    out["machine busy"] = (sum(ticks[:8]) - idle) / TICK
    out["machine total"] = sum(ticks[:8]) / TICK
    return out


def service_class(name: str) -> str:
    return "GPU workers" if name.startswith("gpu") else name


OURS = ("control", "api", "GPU workers", "postgres", "redis")


# -- the run ------------------------------------------------------------------------------------


class Fleet:
    """The services, the ops DB (read directly) and the trigger client of one run."""

    def __init__(self, services: Services, ops: Engine, client: httpx.Client, log: Any) -> None:
        self.services, self.ops, self.client, self.log = services, ops, client, log
        self.triggered = 0

    def counts(self) -> tuple[int, int, int, str | None]:
        """(unfinished, settled, failed or skipped, the latest error) of the probe project."""
        with self.ops.connect() as conn:
            rows = conn.execute(text("SELECT state, count(*) FROM cycle GROUP BY state")).all()
            error = conn.execute(
                text(
                    "SELECT error FROM cycle WHERE state IN ('failed', 'skipped_repeat') "
                    "ORDER BY id DESC LIMIT 1"
                )
            ).scalar()
        by_state = dict(rows)
        settled = by_state.get(SETTLED, 0)
        bad = sum(v for k, v in by_state.items() if k in ENDED and k != SETTLED)
        unfinished = sum(v for k, v in by_state.items() if k not in ENDED)
        return unfinished, settled, bad, error

    def trigger(self, count: int) -> None:
        for _ in range(count):
            answer = self.client.post("/api/v1/cycles", json={"project": PROJECT})
            if answer.status_code not in (200, 201, 202):
                raise RuntimeError(f"trigger: {answer.status_code} {answer.text[:300]}")
            self.triggered += 1

    def settle(self, until: int, backlog: int, stop_at: int) -> None:
        """Keep `backlog` unfinished cycles (never triggering past `stop_at` in all) until
        `until` cycles have settled; fail on a stall or on failures."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while time.monotonic() < deadline:
            unfinished, settled, bad, error = self.counts()
            if bad:
                raise RuntimeError(f"{bad} cycle(s) did not reach {SETTLED}; latest: {error}")
            if settled >= until:
                return
            self.trigger(max(0, min(backlog - unfinished, stop_at - self.triggered)))
            self.services.check_alive()
            time.sleep(POLL_S)
        raise RuntimeError(f"{until} cycles did not settle within {PHASE_TIMEOUT_S:g} s")

    def settled_ids(self) -> list[tuple[int, float]]:
        """The settled cycles, (id, when it settled), in settling order."""
        with self.ops.connect() as conn:
            rows = conn.execute(
                text("SELECT id, updated_at FROM cycle WHERE state = :s"), {"s": SETTLED}
            ).all()
        return sorted(((int(i), ts(at) or 0.0) for i, at in rows), key=lambda r: r[1])


def phase(
    fleet: Fleet, workers: int, warmup: int, measured: int, log: Callable[[str], None]
) -> dict[str, Any]:
    """One phase: `warmup` more settlements discarded, then `measured` in the window."""
    groups = {proc.pid: service_class(name) for name, proc in fleet.services.procs.items()}
    before = len(fleet.settled_ids())
    backlog = 2 * workers + 4
    stop_at = fleet.triggered + warmup + measured + backlog
    fleet.settle(before + warmup, backlog, stop_at)
    cpu0 = cpu_sample(groups)
    fleet.settle(before + warmup + measured, backlog, stop_at)
    cpu1 = cpu_sample(groups)
    settled = fleet.settled_ids()
    start_at = settled[before + warmup - 1][1]
    window = settled[before + warmup : before + warmup + measured]
    span = window[-1][1] - start_at
    rate = measured / span * 60 if span > 0 else float("nan")
    figures = window_figures(fleet.ops, [cid for cid, _ in window])
    cpu = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1 if k != "machine total"}
    wall = cpu1["machine total"] - cpu0["machine total"]
    cores = os.cpu_count() or 1
    ours = sum(v for k, v in cpu.items() if k.startswith(OURS))
    log(
        f"{workers} GPU worker(s): {measured} cycles in {span:.1f} s = {rate:.1f} cycles/min; "
        f"GPU busy {figures['gpu_busy_s'] / (workers * span):.0%}; machine busy "
        f"{cpu['machine busy'] / wall:.0%} of {cores} cores"
    )
    return {
        "workers": workers,
        "cycles": measured,
        "window_s": span,
        "cycles_per_min": rate,
        "gpu_busy_fraction": figures.pop("gpu_busy_s") / (workers * span) if span > 0 else 0.0,
        **figures,
        "cpu_s": dict(sorted(cpu.items(), key=lambda kv: -kv[1])),
        "cpu_cores_used": {k: v / (wall / cores) for k, v in cpu.items()},
        # What one cycle costs the service's processes, and the rate that cost allows on this
        # machine's cores were nothing else running (a ceiling, not a measurement).
        "cpu_s_per_cycle": {k: v / measured for k, v in cpu.items() if k.startswith(OURS)},
        "service_cpu_s_per_cycle": ours / measured,
        "cpu_bound_cycles_per_min": cores * 60 * measured / ours if ours else float("nan"),
    }


def window_figures(ops: Engine, ids: list[int]) -> dict[str, Any]:
    """Per-step medians, queue waits and the GPU time of the window's cycles (seconds)."""
    with ops.connect() as conn:
        steps = conn.execute(
            text(
                "SELECT cycle_id, name, started_at, finished_at FROM cycle_step "
                "WHERE cycle_id = ANY(:ids) AND status = 'done'"
            ),
            {"ids": ids},
        ).all()
        rows = conn.execute(
            text("SELECT id, created_at, fingerprint FROM cycle WHERE id = ANY(:ids)"),
            {"ids": ids},
        ).all()
        cycles = {cid: created for cid, created, _ in rows}
        jobs = conn.execute(
            text("SELECT cycle_id, finished_at, gpu_seconds FROM job WHERE cycle_id = ANY(:ids)"),
            {"ids": ids},
        ).all()
    per_step: dict[str, list[float]] = {name: [] for name in STEPS}
    starts: dict[tuple[int, str], float] = {}
    for cycle_id, name, started, finished in steps:
        if name in per_step and started and finished:
            per_step[name].append((ts(finished) or 0.0) - (ts(started) or 0.0))
            starts[(cycle_id, name)] = ts(started) or 0.0
    plan_waits = [
        starts[(cid, "planned")] - (ts(created) or 0.0)
        for cid, created in cycles.items()
        if (cid, "planned") in starts
    ]
    analyze_waits = [
        starts[(cid, "analyzing")] - (ts(finished) or 0.0)
        for cid, finished, _ in jobs
        if (cid, "analyzing") in starts and finished
    ]

    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    return {
        "step_median_s": {name: med(values) for name, values in per_step.items()},
        "control_s_per_cycle": sum(med(v) for v in per_step.values()),
        "wait_median_s": {
            "trigger -> plan starts": med(plan_waits),
            "job finished -> analyze starts": med(analyze_waits),
        },
        "job_gpu_seconds_median_s": med([float(g or 0.0) for _, _, g in jobs]),
        # Cycles of the window whose sweep point another cycle also ran (two plans at once).
        "duplicate_points": len(rows) - len({fp for _, _, fp in rows}),
        "gpu_busy_s": sum(float(g or 0.0) for _, _, g in jobs),
    }


# -- main ---------------------------------------------------------------------------------------


def make_repo(root: Path, job_s: float) -> Path:
    config = probe_config(
        PROJECT,
        "probe",
        "probe.main",
        120,
        parameters={"k": list(range(K_POINTS)), "j": list(range(J_POINTS)), "sleep_s": [job_s]},
        defaults={"k": 0, "j": 0, "sleep_s": job_s},
    )
    return make_probe_repo(root, PROJECT, "probe", PROBE, config, "fleet probe project")


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    workers = args.workers or (4 if args.quick else GOAL_WORKERS)
    per_worker = args.cycles or (5 if args.quick else 10)
    redis_url = args.redis_url
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    phases: list[dict[str, Any]] = []
    try:
        with databases("fleet_bench") as urls:
            flush_redis(redis_url)
            (tmp / "state").mkdir()
            (tmp / "logs").mkdir()
            port = free_port()
            pythonpath = [str(ROOT), os.environ.get("PYTHONPATH")]
            env = autopilot_env(
                {
                    "AUTOPILOT_STATE_DIR": str(tmp / "state"),
                    "AUTOPILOT_PORT": str(port),
                    "AUTOPILOT_OPS_URL": urls["ops"],
                    "AUTOPILOT_MEMORY_URL": urls["memory"],
                    "AUTOPILOT_BROKER_URL": redis_url,
                    "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": "true",
                    "AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT": "100000",
                    "AUTOPILOT_LOG_LEVEL": "WARNING",
                    "PYTHONPATH": os.pathsep.join(filter(None, pythonpath)),
                }
            )
            token = register_probe(env, tmp, PROJECT, make_repo(tmp, args.job_s))
            # A GPU host fetches the forge over HTTP with a `worker` token (docs/design.md, "Hosts
            # and boundaries").
            gpu_env = {"AUTOPILOT_CONTROL_TOKEN": new_token(env, tmp, "gpu", "worker")}
            services = Services(env, tmp / "logs", tmp)
            ops = create_engine(urls["ops"])
            control = ["worker", "control", "--beat", "--loglevel", "WARNING"]
            if args.control_concurrency:
                control += ["--concurrency", str(args.control_concurrency)]
            try:
                services.cli("api", "serve")
                services.cli("control", *control)
                base = f"http://127.0.0.1:{port}"
                wait_http(f"{base}/healthz", services)
                headers = {"Authorization": f"Bearer {token}"}
                with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
                    fleet = Fleet(services, ops, client, log)
                    started = 0
                    for n in (1, workers):
                        while started < n:
                            gpu = ["worker", "gpu", "--kind", "cpu", "--device", str(started)]
                            services.cli(
                                f"gpu{started}", *gpu, "--loglevel", "WARNING", extra_env=gpu_env
                            )
                            started += 1
                        # The first warm-up also builds the project venv.
                        phases.append(phase(fleet, n, max(2, n), per_worker * n, log))
            finally:
                services.stop_all()
                ops.dispose()
                flush_redis(redis_url)
    finally:
        if args.keep:
            log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return report(args, workers, phases)


def report(args: argparse.Namespace, workers: int, phases: list[dict[str, Any]]) -> dict[str, Any]:
    one, many = phases[0], phases[-1]
    efficiency = many["cycles_per_min"] / (workers * one["cycles_per_min"])
    rate_ok = many["cycles_per_min"] >= GOAL_CYCLES_PER_MIN
    eff_ok = efficiency >= GOAL_EFFICIENCY
    return {
        "bench": "fleet",
        "quick": bool(args.quick),
        "workers": workers,
        "job_s": args.job_s,
        "control_concurrency": args.control_concurrency or "default",
        "cycles_per_min": many["cycles_per_min"],
        "scaling_efficiency": efficiency,
        "baseline": {"cycles_per_min_1_worker": one["cycles_per_min"]},
        # Ours over the ideal linear scaling of the 1-worker rate (higher is better here).
        "ratio": efficiency,
        "goal": {
            "cycles_per_min_min": GOAL_CYCLES_PER_MIN,
            "at_workers": GOAL_WORKERS,
            "scaling_efficiency_min": GOAL_EFFICIENCY,
            "cycles_per_min_met": rate_ok and workers >= GOAL_WORKERS,
            "scaling_efficiency_met": eff_ok,
            "met": rate_ok and eff_ok and workers >= GOAL_WORKERS,
        },
        "phases": phases,
        "machine": machine_line(),
        "load_average": os.getloadavg(),
        "date": today(),
    }


def print_text(result: dict[str, Any]) -> None:
    g = result["goal"]
    print(f"fleet ({result['machine']}; {result['date']}; job {result['job_s']} s)")
    for p in result["phases"]:
        print(
            f"  {p['workers']:>2} GPU worker(s): {p['cycles_per_min']:.1f} cycles/min over "
            f"{p['cycles']} cycles ({p['window_s']:.1f} s), GPU busy {p['gpu_busy_fraction']:.0%}, "
            f"duplicate points {p['duplicate_points']}"
        )
        print(
            "     step medians: "
            + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in p["step_median_s"].items())
            + f" (sum {p['control_s_per_cycle']:.2f} s)"
        )
        print("     waits: " + ", ".join(f"{k} {v:.2f} s" for k, v in p["wait_median_s"].items()))
        print(
            f"     service CPU {p['service_cpu_s_per_cycle']:.2f} s/cycle: "
            + ", ".join(f"{k} {v:.3f}" for k, v in p["cpu_s_per_cycle"].items())
            + f"; CPU-bound ceiling {p['cpu_bound_cycles_per_min']:.0f} cycles/min"
        )
        print(
            "     cores used: " + ", ".join(f"{k} {v:.2f}" for k, v in p["cpu_cores_used"].items())
        )
    print(
        f"  cycles_per_min {result['cycles_per_min']:.1f} (goal >= {g['cycles_per_min_min']:g} "
        f"at {g['at_workers']} workers: {'met' if g['cycles_per_min_met'] else 'MISSED'})"
    )
    print(
        f"  scaling_efficiency {result['scaling_efficiency']:.2f} (goal >= "
        f"{g['scaling_efficiency_min']}: {'met' if g['scaling_efficiency_met'] else 'MISSED'})"
    )


def main() -> int:
    parser = bench_parser(__doc__, quick="4 GPU workers, 5 cycles per worker")
    parser.add_argument("--workers", type=int, default=0, help="GPU workers (default 16)")
    parser.add_argument("--job-s", type=float, default=2.5, help="each experiment's sleep")
    parser.add_argument("--cycles", type=int, default=0, help="measured cycles per worker")
    parser.add_argument("--control-concurrency", type=int, default=0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/12")
    parser.add_argument("--keep", action="store_true", help="keep the state dir and logs")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    emit(run(args, log), args.json, indent=2, text=print_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
