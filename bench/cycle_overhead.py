"""Cycle orchestration overhead and trigger latency, on the embedded defaults.

1. Overhead: a cycle's wall time (Cycle.created_at to Cycle.updated_at when it reaches
   `awaiting_review`) minus the experiment's own run time, two ways: the Job's `gpu_seconds`
   (the runner's spawn-to-exit) and `first_line_at` -> `finished_at` (user code only). Median
   over 20 cycles (5 with --quick), one at a time, after one warm-up cycle that builds the
   project venv. Real processes: `python -m workers.cli serve`, `worker control --beat` and
   `worker gpu --kind cpu --device 0`, SQLite and the filesystem broker in a temporary state
   dir. The research repo holds a small probe experiment (sleeps `sleep_s` = 0.2 s) with a
   30-point parameter space, so the default sweep agent proposes a fresh point each cycle.
2. Trigger latency: p50/p95/p99 of 200 `POST /api/v1/cycles` at 20 concurrent keep-alive
   clients (threads, one httpx.Client each), with both workers stopped so the new cycles stay
   `planned` (the API path alone: insert, commit, ring the doorbell). Baseline, same run: a
   hello-world FastAPI route (bench/_hello_app.py) served the same way (uvicorn, one process,
   same host), same load. Rounds alternate ours/hello (3 rounds full, 1 with --quick); the
   figures are the medians over rounds of each round's percentiles.

    python bench/cycle_overhead.py [--quick] [--json] [--keep]

Goal: overhead <= 1.5 s per cycle on SQLite; trigger p99 <= 2x the hello-world p99.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
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
    percentile,
    probe_config,
    register_probe,
    today,
    ts,
    wait_http,
)

PROJECT = "bench-probe"
OVERHEAD_GOAL_S = 1.5
RATIO_GOAL = 2.0  # a trigger at most twice a hello-world FastAPI route's p99
POLL_S = 0.1
CYCLE_TIMEOUT_S = 180.0
WARMUP_TIMEOUT_S = 900.0  # builds the project venv
REQUESTS, CLIENTS = 200, 20


def make_repo(root: Path, name: str, points: int = 30) -> Path:
    """The probe experiment with a `points`-point space (`k`), so each cycle gets a fresh one."""
    config = probe_config(
        name,
        "probe",
        "probe.main",
        120,
        parameters={"k": list(range(points)), "sleep_s": [0.2]},
        defaults={"k": 0, "sleep_s": 0.2},
    )
    return make_probe_repo(root, name, "probe", PROBE, config, "probe project")


# -- 1. overhead --------------------------------------------------------------------------------

ENDS = ("awaiting_review", "approved", "rejected", "skipped_repeat", "failed", "cancelled")


def run_cycle(
    client: httpx.Client, services: Services, timeout: float = CYCLE_TIMEOUT_S
) -> dict[str, Any]:
    created = client.post("/api/v1/cycles", json={"project": PROJECT})
    if created.status_code != 201:
        raise RuntimeError(f"trigger refused: {created.status_code} {created.text}")
    cycle_id = created.json()["id"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body: dict[str, Any] = client.get(f"/api/v1/cycles/{cycle_id}").json()
        if body["state"] in ENDS:
            if body["state"] != "awaiting_review":
                raise RuntimeError(f"cycle {cycle_id} ended {body['state']}: {body.get('error')}")
            return body
        services.check_alive()
        time.sleep(POLL_S)
    raise RuntimeError(f"cycle {cycle_id} did not reach awaiting_review in {timeout:g} s")


JOB_COLUMNS = (
    "submitted_at",
    "prepared_at",
    "leased_at",
    "started_at",
    "first_line_at",
    "finished_at",
    "gpu_seconds",
)


def job_row(ops_db: Path, job_id: int) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(f"file:{ops_db}?mode=ro", uri=True)) as db:
        row = db.execute(f"SELECT {', '.join(JOB_COLUMNS)} FROM job WHERE id = ?", (job_id,))
        values = row.fetchone()
    if values is None:
        raise RuntimeError(f"job {job_id} not in the ops DB")
    return dict(zip(JOB_COLUMNS, values, strict=True))


def cycle_figures(cycle: dict[str, Any], job: dict[str, Any]) -> dict[str, float]:
    """One cycle's wall time, experiment time and the timeline of its hops (seconds)."""
    steps: dict[str, dict[str, Any]] = {}
    for step in cycle["steps"]:
        steps.setdefault(step["name"], step)  # first attempt of each
    created, done = ts(cycle["created_at"]), ts(cycle["updated_at"])
    if created is None or done is None:
        raise RuntimeError(f"cycle {cycle['id']} has no timestamps")
    j = {k: ts(job[k]) for k in JOB_COLUMNS if k != "gpu_seconds"}

    def start(name: str) -> float | None:
        return ts(steps[name]["started_at"]) if name in steps else None

    def end(name: str) -> float | None:
        return ts(steps[name]["finished_at"]) if name in steps else None

    wall = done - created
    gpu_s = float(job["gpu_seconds"] or 0.0)
    first_line, finished = j["first_line_at"], j["finished_at"]
    user_s = (finished - first_line) if first_line and finished else float("nan")
    marks: list[tuple[str, float | None, float | None]] = [
        ("trigger -> plan step starts (advance doorbell)", created, start("planned")),
        ("plan step (config from git, memory, sweep agent)", start("planned"), end("planned")),
        ("prepare step (worktree + branch, job row)", start("preparing"), end("preparing")),
        (
            "job submitted -> prepared (prepare doorbell, venv, guard)",
            j["submitted_at"],
            j["prepared_at"],
        ),
        ("prepared -> leased (gpu doorbell, lease)", j["prepared_at"], j["leased_at"]),
        ("leased -> process started", j["leased_at"], j["started_at"]),
        ("process started -> first line (interpreter)", j["started_at"], first_line),
        ("experiment (first line -> finished)", first_line, finished),
        ("finished -> analyze step starts (advance doorbell)", finished, start("analyzing")),
        ("analyze step", start("analyzing"), end("analyzing")),
        ("commit step (report, plot, git commit)", start("committing"), end("committing")),
        ("publish step (push, PR, findings)", start("publishing"), end("publishing")),
    ]
    figures = {
        "wall_s": wall,
        "gpu_seconds": gpu_s,
        "first_line_to_finished_s": user_s,
        "overhead_s": wall - gpu_s,
        "overhead_first_line_s": wall - user_s,
    }
    for label, a, b in marks:
        figures[f"part: {label}"] = (b - a) if a is not None and b is not None else float("nan")
    return figures


def measure_overhead(
    client: httpx.Client, services: Services, ops_db: Path, cycles: int, log: Callable[[str], None]
) -> tuple[list[dict[str, float]], float]:
    started = time.monotonic()
    warm = run_cycle(client, services, timeout=WARMUP_TIMEOUT_S)
    log(f"warm-up cycle {warm['id']}: awaiting_review after {time.monotonic() - started:.1f} s")
    rows = []
    for i in range(cycles):
        cycle = run_cycle(client, services)
        figures = cycle_figures(cycle, job_row(ops_db, int(cycle["job_id"])))
        rows.append(figures)
        log(
            f"cycle {i + 1}/{cycles} (id {cycle['id']}, {cycle['parameters']}): wall "
            f"{figures['wall_s']:.3f} s, gpu_seconds {figures['gpu_seconds']:.3f} s, overhead "
            f"{figures['overhead_s']:.3f} s"
        )
    return rows, time.monotonic() - started


# -- 2. trigger latency -------------------------------------------------------------------------


def load(
    base: str, path: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[list[float], int]:
    """REQUESTS POSTs from CLIENTS threads, each with its own keep-alive client; latencies ms."""
    per_client = REQUESTS // CLIENTS
    latencies: list[float] = []
    errors = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def client_thread() -> None:
        mine: list[float] = []
        bad = 0
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            # Open the keep-alive connection before the clock starts (not counted).
            client.post(path, json=body)
            try:
                barrier.wait(timeout=60)
            except threading.BrokenBarrierError:
                return
            for _ in range(per_client):
                t0 = time.perf_counter()
                try:
                    status = client.post(path, json=body).status_code
                except httpx.HTTPError:
                    status = 0
                mine.append((time.perf_counter() - t0) * 1000)
                bad += status not in (200, 201)
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    threads = [threading.Thread(target=client_thread, daemon=True) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    if any(t.is_alive() for t in threads) or len(latencies) != per_client * CLIENTS:
        raise RuntimeError("a load client did not finish")
    return latencies, errors[0]


def summary(latencies: list[float]) -> dict[str, float]:
    return {
        "p50_ms": percentile(latencies, 0.50, interpolate=True),
        "p95_ms": percentile(latencies, 0.95, interpolate=True),
        "p99_ms": percentile(latencies, 0.99, interpolate=True),
        "max_ms": max(latencies),
    }


def measure_latency(
    base: str, hello: str, token: str, rounds: int, log: Callable[[str], None]
) -> dict[str, Any]:
    ours_rounds, hello_rounds, errors = [], [], {"ours": 0, "hello": 0}
    for r in range(rounds):
        pairs = [
            ("ours", base, "/api/v1/cycles", {"Authorization": f"Bearer {token}"}),
            ("hello", hello, "/hello", {}),
        ]
        if r % 2:
            pairs.reverse()
        for name, url, path, headers in pairs:
            lat, bad = load(url, path, {"project": PROJECT}, headers)
            errors[name] += bad
            figures = summary(lat)
            (ours_rounds if name == "ours" else hello_rounds).append(figures)
            log(
                f"round {r + 1}/{rounds} {name}: p50 {figures['p50_ms']:.1f} ms, p95 "
                f"{figures['p95_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, errors {bad}"
            )

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(row[key] for row in rows)

    keys = ("p50_ms", "p95_ms", "p99_ms", "max_ms")
    return {
        "ours": {k: med(ours_rounds, k) for k in keys},
        "hello": {k: med(hello_rounds, k) for k in keys},
        "rounds": {"ours": ours_rounds, "hello": hello_rounds},
        "errors": errors,
    }


# -- main ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def state_dir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cycle-overhead-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    cycles = 5 if args.quick else 20
    rounds = 1 if args.quick else 3
    with state_dir(args.keep) as tmp:
        state = tmp / "state"
        log_dir = tmp / "logs"
        state.mkdir()
        log_dir.mkdir()
        port, hello_port = free_port(), free_port()
        pythonpath = [str(ROOT), os.environ.get("PYTHONPATH")]
        env = autopilot_env(
            {
                "AUTOPILOT_STATE_DIR": str(state),
                "AUTOPILOT_PORT": str(port),
                "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": "true",
                "AUTOPILOT_MAX_LIVE_CYCLES_PER_PROJECT": "1000",
                "PYTHONPATH": os.pathsep.join(filter(None, pythonpath)),
            }
        )
        token = register_probe(env, tmp, PROJECT, make_repo(tmp, PROJECT))
        # The GPU worker fetches the project from the control host's forge over HTTP.
        env["AUTOPILOT_CONTROL_TOKEN"] = new_token(env, tmp, "bench-gpu", "worker")
        base = f"http://127.0.0.1:{port}"
        hello = f"http://127.0.0.1:{hello_port}"
        services = Services(env, log_dir, tmp)
        try:
            services.cli("api", "serve")
            services.cli("control", "worker", "control", "--beat", "--loglevel", "WARNING")
            services.cli(
                "gpu", "worker", "gpu", "--kind", "cpu", "--device", "0", "--loglevel", "WARNING"
            )
            wait_http(f"{base}/healthz", services)
            log(f"state dir {tmp}; API on {base}")
            headers = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=base, headers=headers, timeout=30) as client:
                rows, spent = measure_overhead(client, services, state / "ops.db", cycles, log)
            # Trigger latency: the API alone; new cycles stay planned (no worker consumes).
            services.stop("gpu")
            services.stop("control")
            services.start(
                "hello",
                [sys.executable, str(ROOT / "bench" / "_hello_app.py"), "--port", str(hello_port)],
            )
            wait_http(f"{hello}/healthz", services)
            latency = measure_latency(base, hello, token, rounds, log)
        finally:
            services.stop_all()
    return report(args, rows, spent, latency)


def report(
    args: argparse.Namespace, rows: list[dict[str, float]], spent: float, latency: dict[str, Any]
) -> dict[str, Any]:
    def col(key: str) -> list[float]:
        return [row[key] for row in rows]

    overhead_med = statistics.median(col("overhead_s"))
    parts = {
        key.removeprefix("part: "): statistics.median(col(key))
        for key in rows[0]
        if key.startswith("part: ")
    }
    ours, hello = latency["ours"], latency["hello"]
    ratio = ours["p99_ms"] / hello["p99_ms"]
    overhead_ok = overhead_med <= OVERHEAD_GOAL_S
    ratio_ok = ratio <= RATIO_GOAL
    return {
        "bench": "cycle_overhead",
        "quick": bool(args.quick),
        "cycles": len(rows),
        "measured": {
            "overhead_median_s": overhead_med,
            "overhead_p95_s": percentile(col("overhead_s"), 0.95, interpolate=True),
            "overhead_first_line_median_s": statistics.median(col("overhead_first_line_s")),
            "overhead_first_line_p95_s": percentile(
                col("overhead_first_line_s"), 0.95, interpolate=True
            ),
            "experiment_gpu_seconds_median_s": statistics.median(col("gpu_seconds")),
            "experiment_first_line_to_finished_median_s": statistics.median(
                col("first_line_to_finished_s")
            ),
            "cycle_wall_median_s": statistics.median(col("wall_s")),
            "cycle_wall_p95_s": percentile(col("wall_s"), 0.95, interpolate=True),
            "trigger_p50_ms": ours["p50_ms"],
            "trigger_p95_ms": ours["p95_ms"],
            "trigger_p99_ms": ours["p99_ms"],
            "trigger_errors": latency["errors"]["ours"],
            "overhead_phase_s": spent,
        },
        "baseline": {
            "hello_p50_ms": hello["p50_ms"],
            "hello_p95_ms": hello["p95_ms"],
            "hello_p99_ms": hello["p99_ms"],
            "hello_errors": latency["errors"]["hello"],
        },
        "ratio": ratio,
        "goal": {
            "overhead_s_max": OVERHEAD_GOAL_S,
            "ratio_max": RATIO_GOAL,
            "overhead_met": overhead_ok,
            "ratio_met": ratio_ok,
            "met": overhead_ok and ratio_ok,
        },
        "overhead_s": overhead_med,
        "p95_ms": ours["p95_ms"],
        "breakdown_median_s": parts,
        "latency_rounds": latency["rounds"],
        "load": {"requests": REQUESTS, "clients": CLIENTS, "workers_during_load": "stopped"},
        "machine": machine_line(),
        "date": today(),
    }


def print_text(result: dict[str, Any]) -> None:
    m, b, g = result["measured"], result["baseline"], result["goal"]
    print(f"cycle_overhead ({result['cycles']} cycles; {result['machine']}; {result['date']})")
    print(f"  cycle wall median           {m['cycle_wall_median_s']:.3f} s")
    print(f"  experiment gpu_seconds med  {m['experiment_gpu_seconds_median_s']:.3f} s")
    print(f"  experiment first line->end  {m['experiment_first_line_to_finished_median_s']:.3f} s")
    print(
        f"  overhead median / p95       {m['overhead_median_s']:.3f} / {m['overhead_p95_s']:.3f} s"
        f"  (goal <= {g['overhead_s_max']} s: {'met' if g['overhead_met'] else 'MISSED'})"
    )
    print(
        f"  overhead vs first line->end {m['overhead_first_line_median_s']:.3f} / "
        f"{m['overhead_first_line_p95_s']:.3f} s"
    )
    print("  where the median cycle goes:")
    for label, value in result["breakdown_median_s"].items():
        print(f"    {value * 1000:9.1f} ms  {label}")
    print(
        f"  trigger p50/p95/p99         {m['trigger_p50_ms']:.1f} / {m['trigger_p95_ms']:.1f} / "
        f"{m['trigger_p99_ms']:.1f} ms (errors {m['trigger_errors']})"
    )
    print(
        f"  hello   p50/p95/p99         {b['hello_p50_ms']:.1f} / {b['hello_p95_ms']:.1f} / "
        f"{b['hello_p99_ms']:.1f} ms"
    )
    print(
        f"  ratio (p99 / hello p99)     {result['ratio']:.2f} "
        f"(goal <= {g['ratio_max']}: {'met' if g['ratio_met'] else 'MISSED'})"
    )


def main() -> int:
    parser = bench_parser(__doc__, quick="5 cycles, 1 latency round")
    parser.add_argument("--keep", action="store_true", help="keep the state dir and logs")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    emit(run(args, log), args.json, indent=2, text=print_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
