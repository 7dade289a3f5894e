"""Detection power of command experiments for a 5% slow-down of a lab's own benchmark script.

The lab's script (written to a temporary folder and copied into both arms' trees, as a worker
exports base and head side by side) sums squares in a pure-Python loop of `--n` x `--work`
steps, `--reps` times in one process, and prints one line with the fastest (`--stat min`) or
median repetition's time, measured inside with its clock (`301 reps of 50000 steps, min time
1.8772ms`): process start-up is not in the metric, as in a real lab's benchmark. The command
experiment (built here as `autopilot.toml` text) reads that line with `metric_pattern`; its
space is `work = [1.0, 1.05]`, default 1.0. The knobs (`Knobs`: repeats, warm-up runs, work
size, repetitions, clock, statistic) are the ones a lab sets; their defaults are the ones that
met the goal on this noisy 2-core VM (docs/benchmarks.md has the ones that did not).

Each trial is one command job as a GPU host runs it: `command.schedule(repeats, warmup_runs,
seed)` (warm-up runs, then blocks of one candidate run and two baseline runs, the second being
the A/A pair's, in a seeded order), every run a real process through our launcher
(`workers.arms.Arms`, `runner.run_job`, unconfined or under bubblewrap with
`--sandbox on`), then the control plane's judgement of the raw result under the spec the
service writes (`jobs.command_spec` + the seed): median paired ratio candidate/baseline,
bootstrap 95% CI, A/A noise floor (`app.cycles.judge.command`). Trial kinds, interleaved:

- B: the candidate runs `--work=1.05` (5% more work); detected when the verdict is `slower`;
- A/A: the candidate runs the baseline's parameters; a false positive is any verdict other
  than `inconclusive`.

Each trial has its own seed, so its own run order and bootstrap. The baseline, judged on the
same runs: naive, the mean of all the baseline arm's runs against the mean of the candidate's,
a difference claimed beyond 2.5% (half the true effect). ``ratio`` = our error rate / the naive
error rate (misses plus false positives over all trials; lower is better).

    python bench/command_power.py [--quick] [--json] [--sandbox on|off] [--repeats R] ...
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import bench_parser, machine, percentile, print_json, today

from app.cycles.judge.command import judge_command
from app.jobs.service import command_spec
from app.projects import command as command_kind
from app.projects.config import Experiment, parse
from app.settings import Settings
from workers.arms import ArmPlace, Arms
from workers.evaluator import Evaluator

EFFECT = 1.05
NAIVE_THRESHOLD = 0.025
GOAL = {"detection_rate_min": 0.90, "false_positive_rate_max": 0.05, "beats_naive": True}

# A lab's benchmark script as it already is: it knows nothing of the service.
SCRIPT = '''
"""Sums squares in a pure-Python loop, `reps` times; prints their fastest or median time."""
import argparse
import json
import os
import statistics
import time


def work(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--work", type=float, default=1.0)
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--reps", type=int, default=301)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--stat", choices=("min", "median"), default="min")
    parser.add_argument("--out", default=None, help="a JSON file for the last pass's total")
    args = parser.parse_args()
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    n = round(args.n * args.work)
    work(n // 10)  # the loop's first pass, untimed
    times = []
    total = 0
    for _ in range(args.reps):
        started = clock()
        total = work(n)
        times.append(clock() - started)
    best = min(times) if args.stat == "min" else statistics.median(times)
    print(f"{args.reps} reps of {n} steps, {args.stat} time {best * 1000:.4f}ms")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as out:
            json.dump({"n": n, "total": total}, out)


if __name__ == "__main__":
    main()
'''

# The hold-out evaluator of `--evaluator on`: a program of the base commit's tree (never the
# arms'), given the run's artifact read-only. Its quality gate: the sum the run wrote, checked
# against the closed form (1.0 when right, so any wrong answer fails the 5% tolerance).
EVALUATOR = """
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("--artifact", required=True)
args = parser.parse_args()
with open(args.artifact) as f:
    written = json.load(f)
n = written["n"]
expected = (n - 1) * n * (2 * n - 1) // 6
print(f"check {1.0 if written['total'] == expected else 2.0:.3f}")
"""
EVALUATOR_LINES = """
evaluator = ["python", "check.py", "--artifact={artifact}"]
artifacts = ["out/total.json"]
evaluator_check_pattern = 'check (?P<value>[0-9.]+)'
check_direction = "lower"
check_tolerance = 0.05
"""

CONFIG = """
[project]
name = "command-power"
gpu_kind = "cpu"

[experiments.loop]
kind = "command"
command = ["python", "bench.py", "--work={{work}}", "--n={n}", "--reps={reps}", "--clock={clock}",
           "--stat={stat}"{out_arg}]
metric = "rep_ms"
{source_lines}
direction = "lower"
repeats = {repeats}
warmup_runs = {warmup_runs}
time_limit_s = 120

[experiments.loop.parameters]
work = [1.0, {effect}]

[experiments.loop.defaults]
work = 1.0
"""


@dataclass(frozen=True)
class Knobs:
    """What the lab sets: the experiment's blocks and warm-up runs; its script's work size,
    repetitions per run, clock, and which of the repetitions' times it prints."""

    repeats: int = 16
    warmup_runs: int = 1
    n: int = 50_000
    reps: int = 301
    clock: str = "wall"
    stat: str = "min"
    #: Where the metric comes from: "output", the time the script prints (measured inside the
    #: candidate: self-reported); "wall", each run's wall time on the runner's clock, outside
    #: the candidate (process start-up included, so the 5% of work is a little less of it).
    metric_source: str = "output"
    #: "on": each recorded run's artifact is checked by a hold-out evaluator (the quality gate),
    #: run sandboxed from a tree of its own, as `tiny_train`'s is.
    evaluator: str = "off"


def experiment(knobs: Knobs) -> Experiment:
    source_lines = (
        "metric_pattern = 'time (?P<value>[0-9.]+)ms'"
        if knobs.metric_source == "output"
        else f'metric_source = "{knobs.metric_source}"'
    )
    if knobs.evaluator == "on":
        source_lines += EVALUATOR_LINES
    fields = asdict(knobs)
    del fields["metric_source"], fields["evaluator"]
    out_arg = ', "--out=out/total.json"' if knobs.evaluator == "on" else ""
    text = CONFIG.format(effect=EFFECT, source_lines=source_lines, out_arg=out_arg, **fields)
    return parse(text).experiment("loop")


def arm_places(root: Path) -> dict[str, ArmPlace]:
    """The two arms' trees (clean copies of one script, as the worker exports base and head),
    both on the service's own venv."""
    venv = Path(sys.prefix)
    places = {}
    for arm in command_kind.ARMS:
        tree = root / arm
        tree.mkdir(parents=True)
        (tree / "bench.py").write_text(textwrap.dedent(SCRIPT).lstrip())
        places[arm] = ArmPlace(tree, venv, "bench-service-venv", None)
    return places


def naive_verdict(result: dict[str, Any]) -> tuple[str, float]:
    """All the baseline arm's runs against all the candidate's, ratio of means."""
    samples = result["samples"]
    base = samples["baseline"] + samples["baseline_aa"]
    ratio = statistics.fmean(samples["candidate"]) / statistics.fmean(base)
    if ratio > 1 + NAIVE_THRESHOLD:
        return "slower", ratio
    if ratio < 1 - NAIVE_THRESHOLD:
        return "faster", ratio
    return "inconclusive", ratio


def run_trial(
    settings: Settings,
    job_id: int,
    exp: Experiment,
    places: dict[str, ArmPlace],
    candidate: dict[str, Any],
    seed: int,
    evaluator: Evaluator | None = None,
) -> dict[str, Any]:
    """One command job: its schedule's runs, the raw result, both methods' verdicts, and what
    a run cost beside its own time (its evaluation; the fresh tree, reading and logging)."""
    arms = Arms(
        settings,
        job_id,
        exp,
        places,
        {"baseline": dict(exp.defaults), "candidate": candidate},
        command_kind.device_name("cpu"),
        evaluator=evaluator,
    )
    plan = command_kind.schedule(exp.repeats, exp.warmup_runs, seed)
    load = os.getloadavg()[0]
    started = time.monotonic()
    records = arms.run(plan)
    wall = time.monotonic() - started
    result = arms.result(records, name="loop", spec_device="cpu", host="bench")
    spec = {**command_spec(exp), "seed": seed}
    judged = judge_command(result, spec)
    naive, naive_ratio = naive_verdict(result)
    evaluated = [r for r in records if "evaluator_s" in r]
    return {
        "verdict": judged["verdict"],
        "ratio": judged["ratio"],
        "ci": (judged["ci_low"], judged["ci_high"]),
        "floor": judged["noise_floor"]["floor"],
        "naive": naive,
        "naive_ratio": naive_ratio,
        "runs": len(records),
        "wall_s": wall,
        "load": max(load, os.getloadavg()[0]),
        "run_s": statistics.median(r["duration_s"] for r in records),
        "metric": statistics.median(result["samples"]["baseline"]),
        "evaluator_s": (
            statistics.median(r["evaluator_s"] for r in evaluated) if evaluated else None
        ),
        # Per run, the job's time outside its runs and evaluations: each run's fresh copy of
        # its arm's tree, its sandbox's set-up before the runner's clock starts, the reading.
        "outside_s": (wall - sum(r["duration_s"] + r.get("evaluator_s", 0.0) for r in records))
        / len(records),
    }


def rates(effect: list[str], null: list[str]) -> dict[str, Any]:
    detected = sum(v == "slower" for v in effect)
    false_pos = sum(v != "inconclusive" for v in null)
    errors = (len(effect) - detected) + false_pos
    return {
        "detection_rate": detected / len(effect),
        "false_positive_rate": false_pos / len(null),
        "error_rate": errors / (len(effect) + len(null)),
        "detected": f"{detected}/{len(effect)}",
        "false_positives": f"{false_pos}/{len(null)}",
    }


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 4),
        "p10": round(percentile(values, 0.1, interpolate=True), 4),
        "p90": round(percentile(values, 0.9, interpolate=True), 4),
        "min": round(min(values), 4),
        "max": round(max(values), 4),
    }


def parse_args() -> Any:
    parser = bench_parser(__doc__, quick="6 trials of each kind (the full run: 20)")
    parser.add_argument("--trials", type=int, default=None, help="trials of each kind")
    knobs = Knobs()
    parser.add_argument("--repeats", type=int, default=knobs.repeats, help="blocks per job")
    parser.add_argument(
        "--warmup-runs", type=int, default=knobs.warmup_runs, help="warm-up runs per arm"
    )
    parser.add_argument("--n", type=int, default=knobs.n, help="loop steps per repetition")
    parser.add_argument("--reps", type=int, default=knobs.reps, help="repetitions per run")
    parser.add_argument("--clock", choices=("wall", "cpu"), default=knobs.clock)
    parser.add_argument("--stat", choices=("min", "median"), default=knobs.stat)
    parser.add_argument("--sandbox", choices=("on", "off"), default="off")
    parser.add_argument(
        "--metric-source",
        choices=("output", "wall"),
        default=knobs.metric_source,
        help="the printed time (self-reported) or the runner's clock",
    )
    parser.add_argument(
        "--evaluator",
        choices=("on", "off"),
        default=knobs.evaluator,
        help="check each run's artifact with a hold-out evaluator (the quality gate)",
    )
    parser.add_argument("--seed", type=int, default=2026, help="draws the trials' seeds")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    trials = args.trials or (6 if args.quick else 20)
    knobs = Knobs(
        args.repeats,
        args.warmup_runs,
        args.n,
        args.reps,
        args.clock,
        args.stat,
        args.metric_source,
        args.evaluator,
    )
    exp = experiment(knobs)
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="command-power-"))
    settings = Settings(_env_file=None, state_dir=root / "state", sandbox=args.sandbox)
    places = arm_places(root / "trees")
    evaluator = None
    if knobs.evaluator == "on":
        judge_tree = root / "trees" / "evaluator"
        judge_tree.mkdir(parents=True)
        (judge_tree / "check.py").write_text(textwrap.dedent(EVALUATOR).lstrip())
        evaluator = Evaluator.declared(
            judge_tree, Path(sys.prefix), "bench-service-venv", None, exp
        )
    seen: dict[str, list[dict[str, Any]]] = {"effect": [], "null": []}
    started = time.monotonic()
    try:
        job_id = 0
        for trial in range(trials):
            kinds = [("effect", {"work": EFFECT}), ("null", dict(exp.defaults))]
            rng.shuffle(kinds)
            for kind, candidate in kinds:
                job_id += 1
                seed = rng.randrange(1, 2**31)
                out = run_trial(settings, job_id, exp, places, candidate, seed, evaluator)
                seen[kind].append(out)
                if not args.json:
                    print(
                        f"trial {trial + 1}/{trials} {kind:6}: {out['verdict']:12} "
                        f"ratio {out['ratio']:.4f} CI [{out['ci'][0]:.4f}, {out['ci'][1]:.4f}] "
                        f"floor {out['floor']:.4f}; naive {out['naive']:12} "
                        f"{out['naive_ratio']:.4f}; {out['wall_s']:.1f} s, load {out['load']:.1f}",
                        file=sys.stderr,
                    )
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(root)
    duration = time.monotonic() - started

    effect, null = seen["effect"], seen["null"]
    ours = rates([t["verdict"] for t in effect], [t["verdict"] for t in null])
    base = rates([t["naive"] for t in effect], [t["naive"] for t in null])
    if base["error_rate"] > 0:
        ratio: float | None = ours["error_rate"] / base["error_rate"]
    else:
        ratio = 1.0 if ours["error_rate"] == 0 else None
    met = (
        ours["detection_rate"] >= GOAL["detection_rate_min"]
        and ours["false_positive_rate"] <= GOAL["false_positive_rate_max"]
        and ours["error_rate"] < base["error_rate"]
    )
    every = effect + null
    report = {
        "benchmark": "command_power",
        "quick": args.quick,
        "sandbox": args.sandbox,
        "trials": trials,
        "effect": EFFECT,
        "knobs": asdict(knobs),
        "runs_per_trial": every[0]["runs"],
        # The baseline's median metric: ms printed (output), or s on the runner's clock (wall).
        "metric_median": round(statistics.median(t["metric"] for t in every), 4),
        "evaluator_s_median": (
            round(statistics.median(t["evaluator_s"] for t in every), 4)
            if every[0]["evaluator_s"] is not None
            else None
        ),
        "outside_run_s_median": round(statistics.median(t["outside_s"] for t in every), 4),
        "run_s_median": round(statistics.median(t["run_s"] for t in every), 4),
        "trial_s_median": round(statistics.median(t["wall_s"] for t in every), 2),
        "measured": {
            **ours,
            "ratio_effect": spread([t["ratio"] for t in effect]),
            "ratio_null": spread([t["ratio"] for t in null]),
            "noise_floor": spread([t["floor"] for t in every]),
            # What the A/A floor is for: null trials whose CI alone cleared 1.
            "null_ci_clear_of_1": sum(not t["ci"][0] <= 1.0 <= t["ci"][1] for t in null),
            "effect_ci_clear_of_1": sum(t["ci"][0] > 1.0 for t in effect),
        },
        "baseline": {
            "method": f"all baseline-arm runs vs candidate runs, ratio of means, "
            f"threshold {NAIVE_THRESHOLD:.1%}",
            **base,
            "ratio_effect": spread([t["naive_ratio"] for t in effect]),
            "ratio_null": spread([t["naive_ratio"] for t in null]),
        },
        "ratio": ratio,
        "goal": GOAL,
        "goal_met": met,
        "detection_rate": ours["detection_rate"],
        "false_positive_rate": ours["false_positive_rate"],
        "duration_s": round(duration, 1),
        "load_1min": spread([t["load"] for t in every]),
        "per_trial": {
            kind: [f"{t['verdict']} {t['ratio']:.4f} floor {t['floor']:.4f}" for t in seen[kind]]
            for kind in seen
        },
        "machine": machine("cpu", "cores", "python", "os"),
        "date": today(),
    }
    print_json(report, indent=None if args.json else 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
