"""GPU utilisation of a fleet running a mix of 1- and 4-GPU jobs, against the ideal packing of the
same jobs (docs/design.md, "Jobs of several GPUs").

Real processes on the embedded defaults: 4 `worker gpu --kind cpu --device i` (one host of four
CPU "GPUs") and `worker control --beat`, on the filesystem broker and SQLite. The probe project
has four experiments: three one-GPU ones sleeping 1, 2 and 3 s and a four-GPU one sleeping 2 s,
each declaring a time limit `--slack` seconds over its run (what backfill reads). A seeded random
backlog of one-GPU jobs with a four-GPU job every `--every` is submitted at once; the fleet runs
it to the end.

- busy GPU-seconds: each job's run (started_at to finished_at, from the ops DB) times its GPUs;
- makespan: the first start to the last end;
- utilisation: busy / (4 x makespan);
- ideal: the same jobs' runs packed with no gap at all: a lower bound on any schedule's makespan,
  max(busy / 4, the longest run), so `ratio` = ideal / makespan is a floor on how close the
  fleet came to the best packing (1.0: no GPU ever idle while work waited).

    python bench/gang_packing.py [--quick] [--json] [--jobs 24] [--every 6] [--seed 7]
                                 [--slack 1.0] [--scale 1] [--windows 0,8] [--timeline]

Each `--windows` value runs a fleet of its own with that AUTOPILOT_GANG_WINDOW (a job of several
GPUs that close behind the job a worker would take, and that fits the host now, goes first;
0: line order), one after the other on the same backlog; the last is the headline. `--scale`
multiplies every run and its slack: at 1 the runs are 1-3 s, so each job's fixed start-up
(lease, start, result: tens of ms) weighs several times more than on real GPU jobs.

Goal: ratio >= 0.9.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import git
from _common import Services, autopilot_env, bench_parser, machine, print_json, today

from app import broker
from app.db import Stores
from app.jobs import service as jobs
from app.jobs.models import Job, Worker
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings

GPUS = 4
GOAL = {"ratio_min": 0.9}
#: experiment: (its run's length in seconds, its GPUs); its declared time limit is the run's
#: length plus `--slack` (what backfill reads).
EXPERIMENTS = {"one_s": (1.0, 1), "one_m": (2.0, 1), "one_l": (3.0, 1), "four": (2.0, 4)}

PROBE = """
import json, os, socket, time
path = os.environ.get("AUTOPILOT_EVENTS")
if path:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall((json.dumps({"type": "started"}) + "\\n").encode())
    s.close()
spec = json.load(open(os.environ["AUTOPILOT_SPEC"]))
time.sleep(spec["parameters"]["sleep_s"])
a = [1000000 + 997 * (i % 5) for i in range(10)]
pairs = {"a_ns": a, "b_ns": list(a)}
json.dump({"status": "ok", "experiment": spec["experiment"], "parameters": spec["parameters"],
           "noise_floor": {"samples": pairs},
           "comparisons": [{"variant": "probe", "baseline": "base", "samples": pairs,
                            "accuracy": {"max_abs_error": 0.0, "scale": 1.0}}]},
          open(os.environ["AUTOPILOT_RESULT"], "w"))
"""


def make_repo(root: Path, slack: float, scale: float) -> Path:
    repo_dir = root / "packing"
    (repo_dir / "packprobe").mkdir(parents=True)
    (repo_dir / "packprobe" / "__init__.py").write_text("")
    (repo_dir / "packprobe" / "main.py").write_text(PROBE)
    lines = ["[project]", 'name = "packing"', 'gpu_kind = "cpu"', "python_requirements = []"]
    for name, (nominal, gpus) in EXPERIMENTS.items():
        sleep, limit = nominal * scale, (nominal + slack) * scale
        lines += [
            f"[experiments.{name}]",
            'entry = "packprobe.main"',
            f"time_limit_s = {limit}",
            f"gpus = {gpus}",
            f"[experiments.{name}.parameters]",
            f"sleep_s = [{sleep}]",
            f"[experiments.{name}.defaults]",
            f"sleep_s = {sleep}",
        ]
    (repo_dir / "autopilot.toml").write_text("\n".join(lines) + "\n")
    repo = git.Repo.init(repo_dir, initial_branch="main")
    repo.index.add(["packprobe/__init__.py", "packprobe/main.py", "autopilot.toml"])
    actor = git.Actor("bench", "bench@example.invalid")
    repo.index.commit("packing probe", author=actor, committer=actor)
    return repo_dir


def backlog(count: int, every: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ones = ["one_s", "one_m", "one_l"]
    return ["four" if (i + 1) % every == 0 else rng.choice(ones) for i in range(count)]


def ideal_makespan(runs: list[tuple[float, int]]) -> float:
    """A lower bound on any packing's makespan of these (duration, GPUs) runs on GPUS GPUs."""
    busy = sum(d * g for d, g in runs)
    return max(busy / GPUS, max(d for d, _ in runs))


def policy_makespan(jobs: list[tuple[float, int, float]], window: int) -> float:
    """The makespan of these (run, GPUs, declared limit) jobs, in submission order, under the
    service's policy with no overhead at all: a job of several GPUs among the first `window` in
    line that fits now starts first (`gangs.Line.gang_ahead`; 0: never); else the first job in
    line that fits starts; the first of several GPUs that does not fit reserves the GPUs,
    expected free by the running jobs' starts plus limits; a one-GPU job behind it starts only
    if its limit ends before then."""
    line = list(jobs)
    running: list[tuple[float, float, int]] = []  # (end, expected end, GPUs)
    now = 0.0
    while line or running:
        started = True
        while started:
            started = False
            free = GPUS - sum(g for _, _, g in running)
            first_gang = next((i for i, j in enumerate(line[:window]) if j[1] > 1), None)
            if first_gang is not None and line[first_gang][1] <= free and line[0][1] == 1:
                run, gpus, limit = line.pop(first_gang)
                running.append((now + run, now + limit, gpus))
                started = True
                continue
            shadow: float | None = None
            for index, (run, gpus, limit) in enumerate(line):
                if shadow is None and gpus <= free:
                    running.append((now + run, now + limit, gpus))
                    del line[index]
                    started = True
                    break
                if shadow is None and gpus > 1:
                    ends = sorted((expected, g) for _, expected, g in running)
                    have, shadow = free, now
                    for expected, g in ends:
                        have, shadow = have + g, expected
                        if have >= gpus:
                            break
                    continue
                if shadow is not None and gpus == 1 and free >= 1 and now + limit <= shadow:
                    running.append((now + run, now + limit, gpus))
                    del line[index]
                    started = True
                    break
        if not running:
            break
        now = min(end for end, _, _ in running)
        running = [r for r in running if r[0] > now]
    return now


def run(args: Any, work: Path, window: int) -> dict[str, Any]:
    state = work / "state"
    state.mkdir()
    env = autopilot_env(
        {
            "AUTOPILOT_STATE_DIR": str(state),
            "AUTOPILOT_SANDBOX": "off",
            "AUTOPILOT_VENV_SYSTEM_SITE_PACKAGES": "true",
            "AUTOPILOT_GANG_WINDOW": str(window),
        }
    )
    os.environ.update({k: v for k, v in env.items() if k.startswith("AUTOPILOT_")})
    settings = Settings()
    services = Services(env, work, state)
    stores = Stores.from_settings(settings)
    services.cli("db", "db", "upgrade").wait(timeout=120)
    services.procs.pop("db")
    repo = make_repo(work, args.slack, args.scale)
    with stores.ops_session() as session:
        ops.create_project(session, ProjectCreate(name="packing", repo_url=str(repo)))
    services.cli("control", "worker", "control", "--beat", "--loglevel", "WARNING")
    for device in range(GPUS):
        services.cli(
            f"gpu{device}", "worker", "gpu", "--kind", "cpu", "--device", str(device),
            "--no-start-checks", "--loglevel", "WARNING",
        )  # fmt: skip
    try:
        # The backlog arrives at a fleet that is up, as the bound assumes four GPUs from the start.
        up_by = time.monotonic() + 120
        while True:
            services.check_alive()
            with stores.ops_session() as session:
                if session.query(Worker).filter(Worker.kind == "cpu").count() >= GPUS:
                    break
            if time.monotonic() > up_by:
                raise RuntimeError("the four GPU workers did not register in 120 s")
            time.sleep(0.2)
        cfg = project_config.load(repo)
        kinds = backlog(args.jobs, args.every, args.seed)
        ids = []
        with stores.ops_session() as session:
            project = ops.get_project(session, "packing")
            for kind in kinds:
                ids.append(jobs.submit(session, settings, project, cfg, kind, {}).id)
        for _ in range(GPUS):
            broker.ring_gpu(settings, "gpu.cpu")
        deadline = time.monotonic() + 60 + 10 * args.scale * len(ids)
        while True:
            services.check_alive()
            with stores.ops_session() as session:
                rows = session.query(Job).filter(Job.id.in_(ids)).order_by(Job.id).all()
                states = [r.state for r in rows]
                if all(s in ("succeeded", "failed", "cancelled") for s in states):
                    figures = [
                        (r.experiment, r.gpus, r.started_at, r.finished_at, r.state, r.attempts)
                        for r in rows
                    ]
                    extra = {
                        r.started_at: (r.prepared_at, r.leased_at, r.worker, r.id) for r in rows
                    }
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"jobs not finished in time: {states}")
            time.sleep(0.5)
    finally:
        services.stop_all()
    failed = [f for f in figures if f[4] != "succeeded"]
    if failed:
        raise RuntimeError(f"jobs failed: {failed}")
    spans = [(s.timestamp(), e.timestamp(), g) for _, g, s, e, _, _ in figures]
    if args.timeline:  # each job's preparation, lease, run and worker, from the first start
        t0 = min(x[0] for x in spans)
        for f in sorted(figures, key=lambda f: f[2]):
            prepared, leased, worker, job_id = extra[f[2]]
            times = [t.timestamp() - t0 for t in (prepared, leased, f[2], f[3])]
            line = " ".join(f"{t:7.2f}" for t in times)
            print(
                f"job {job_id:3} {f[0]:6} x{f[1]} prep/lease/run {line}  {worker}", file=sys.stderr
            )
    runs = [(e - s, g) for s, e, g in spans]
    start, end = min(s for s, _, _ in spans), max(e for _, e, _ in spans)
    makespan = end - start
    busy = sum(d * g for d, g in runs)
    ideal = ideal_makespan(runs)
    limits = {name: (run_s + args.slack) * args.scale for name, (run_s, _) in EXPERIMENTS.items()}
    same = [(d, g, limits[f[0]]) for (d, g), f in zip(runs, figures, strict=True)]
    policy = policy_makespan(same, window)
    gang_runs = [d for (d, g) in runs if g == GPUS]
    return {
        "jobs": len(ids),
        "gang_jobs": sum(1 for k in kinds if k == "four"),
        "makespan_s": round(makespan, 2),
        "busy_gpu_s": round(busy, 2),
        "utilisation": round(busy / (GPUS * makespan), 4),
        "ideal_makespan_s": round(ideal, 2),
        "ideal_utilisation": round(busy / (GPUS * ideal), 4),
        "ratio": round(ideal / makespan, 4),
        # The same jobs, in the same order, under the same policy with no overhead: what the
        # policy itself leaves idle (the drain), apart from what the implementation adds.
        "policy_makespan_s": round(policy, 2),
        "policy_ratio": round(policy / makespan, 4),
        "policy_vs_ideal": round(ideal / policy, 4),
        # The same runs under the policy in line order (no window): what the window changes.
        "in_order_policy_vs_ideal": round(ideal / policy_makespan(same, 0), 4),
        "median_run_s": round(statistics.median(d for d, _ in runs), 3),
        "gang_run_s_median": round(statistics.median(gang_runs), 3) if gang_runs else None,
        "retries": sum(a - 1 for *_, a in figures),
    }


def main() -> int:
    parser = bench_parser(__doc__, quick="12 jobs, a four-GPU job every 4th")
    parser.add_argument("--jobs", type=int, default=24, help="jobs in the backlog (default 24)")
    parser.add_argument("--every", type=int, default=6, help="a four-GPU job every Nth (6)")
    parser.add_argument("--seed", type=int, default=7, help="the backlog's order (7)")
    parser.add_argument("--timeline", action="store_true", help="print each job's times")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="multiply every run's length and its slack (default 1: runs of 1-3 s)",
    )
    parser.add_argument(
        "--windows",
        default="0,8",
        help="AUTOPILOT_GANG_WINDOW values to run, each a fleet of its own, in turn; the last "
        "is the headline (default 0,8: in line order, then the default)",
    )
    parser.add_argument(
        "--slack",
        type=float,
        default=1.0,
        help="declared time limit minus the run's length, seconds (default 1.0)",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.every = 12, 4
    if args.jobs < 2 or args.every < 2:
        parser.error("--jobs and --every take 2 or more")
    if args.slack < 0.1:
        parser.error(f"--slack {args.slack}: a limit must leave the run at least 0.1 s")
    try:
        windows = [int(w) for w in args.windows.split(",")]
    except ValueError:
        parser.error(f"--windows {args.windows!r}: integers separated by commas, e.g. 0,8")
    if args.scale <= 0:
        parser.error(f"--scale {args.scale}: a positive factor")
    started = time.monotonic()
    by_window = {}
    for window in windows:
        with tempfile.TemporaryDirectory(prefix="gang-packing-") as tmp:
            by_window[window] = run(args, Path(tmp), window)
    measured = by_window[windows[-1]]
    report = {
        "benchmark": "gang_packing",
        "quick": args.quick,
        "gpus": GPUS,
        "seed": args.seed,
        "slack_s": args.slack,
        "scale": args.scale,
        "window": windows[-1],
        "measured": measured,
        "by_window": {str(w): m for w, m in by_window.items()},
        "baseline": {"method": "the same runs packed with no idle GPU (a makespan lower bound)"},
        "ratio": measured["ratio"],
        "goal": GOAL,
        "goal_met": measured["ratio"] >= GOAL["ratio_min"],
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine("cpu", cpus=os.cpu_count()),
        "date": today(),
    }
    print_json(report, indent=None if args.json else 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
