"""GPU time per decision: the sequential stopping rule against the fixed design of 20 blocks.

Real command jobs as a GPU host runs them (`workers.arms.Arms` through our launcher and
runner, every run a real process), judged by the control plane (`judge_command` under the spec
the service writes). The lab's script is `command_power.py`'s (a pure-Python loop timed inside,
the fastest repetition printed), lighter here so that a trial takes seconds. Three true effects,
interleaved: none (the candidate runs the baseline's parameters: an A/A trial), 5% and 30% more
work. Each trial runs the same seed twice:

- fixed: `repeats = 20` blocks, every one run (what noisy scripts need today);
- sequential: at most 20 blocks, stopped by the runner when the rule
  (`autopilot_harness.sequential`) decides (`workers.blocks.run_until_decided`), the judge
  re-checking the stop.

GPU seconds per decision are every run's time, warm-ups and failed runs included
(`Arms.spent_s`). `ratio` = the sequential's mean GPU seconds over the fixed's, averaged over the
three effects; `ratio_30` the same at 30%; `detection_rate` the sequential's share of `slower`
verdicts at 5%; `false_positive_rate` its share of verdicts other than inconclusive under no
effect. The fixed design's rates are measured on the same trials.

    python bench/decision_cost.py [--quick] [--json] [--trials T] [--sandbox on|off]
"""

from __future__ import annotations

import contextlib
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, machine, print_json, today
from command_power import arm_places

from app.cycles.judge.command import judge_command
from app.jobs import stopping
from app.jobs.service import command_spec
from app.projects import command as command_kind
from app.projects.config import Experiment, parse
from app.settings import Settings
from workers import blocks
from workers.arms import ArmPlace, Arms

EFFECTS = {"none": 1.0, "5%": 1.05, "30%": 1.30}
MAX_BLOCKS = 20
GOAL = {
    "ratio_max": 0.5,
    "ratio_30_max": 0.25,
    "detection_rate_min": 0.9,
    "false_positive_rate_max": 0.05,
}

CONFIG = """
[project]
name = "decision-cost"
gpu_kind = "cpu"

[experiments.loop]
kind = "command"
command = ["python", "bench.py", "--work={{work}}", "--n={n}", "--reps={reps}"]
metric = "rep_ms"
metric_pattern = 'time (?P<value>[0-9.]+)ms'
direction = "lower"
repeats = {max_blocks}
warmup_runs = 1
time_limit_s = 120
stopping = "{stopping}"

[experiments.loop.parameters]
work = [1.0, 1.05, 1.3]

[experiments.loop.defaults]
work = 1.0
"""


def experiment(stopping: str, n: int, reps: int) -> Experiment:
    text = CONFIG.format(stopping=stopping, n=n, reps=reps, max_blocks=MAX_BLOCKS)
    return parse(text).experiment("loop")


def run_job(
    settings: Settings,
    job_id: int,
    exp: Experiment,
    places: dict[str, ArmPlace],
    work: float,
    seed: int,
) -> dict[str, Any]:
    """One command job under `exp`'s design: its runs, the judged verdict, its GPU seconds."""
    arms = Arms(
        settings,
        job_id,
        exp,
        places,
        {"baseline": dict(exp.defaults), "candidate": {"work": work}},
        command_kind.device_name("cpu"),
    )
    spec = {**command_spec(exp), "seed": seed}
    plan = command_kind.schedule(exp.repeats, exp.warmup_runs, seed)
    records, stop = blocks.run_until_decided(arms, plan, stopping.rule_of(spec), seed)
    result = arms.result(records, name="loop", spec_device="cpu", host="bench")
    if stop is not None:
        result["stopped"] = {"blocks": stop[1].blocks, "decision": stop[0]}
    judged = judge_command(result, spec)
    return {
        "verdict": judged["verdict"],
        "ratio": judged["ratio"],
        "blocks": blocks.whole_blocks(records),
        "gpu_s": arms.spent_s,
        "stop": stop[0] if stop is not None else None,
    }


def parse_args() -> Any:
    parser = bench_parser(__doc__, quick="4 trials of each effect (the full run: 20)")
    parser.add_argument("--trials", type=int, default=None, help="trials of each effect")
    parser.add_argument("--n", type=int, default=20_000, help="loop steps per repetition")
    parser.add_argument("--reps", type=int, default=61, help="repetitions per run")
    parser.add_argument("--sandbox", choices=("on", "off"), default="off")
    parser.add_argument("--seed", type=int, default=2026, help="draws the trials' seeds")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    trials = args.trials or (4 if args.quick else 20)
    designs = {d: experiment(d, args.n, args.reps) for d in ("fixed", "sequential")}
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="decision-cost-"))
    settings = Settings(_env_file=None, state_dir=root / "state", sandbox=args.sandbox)
    places = arm_places(root / "trees")
    seen: dict[str, dict[str, list[dict[str, Any]]]] = {
        d: {e: [] for e in EFFECTS} for d in designs
    }
    started = time.monotonic()
    try:
        job_id = 0
        for trial in range(trials):
            order = list(EFFECTS.items())
            rng.shuffle(order)
            for effect, work in order:
                seed = rng.randrange(1, 2**31)
                for design, exp in designs.items():
                    job_id += 1
                    out = run_job(settings, job_id, exp, places, work, seed)
                    seen[design][effect].append(out)
                    if not args.json:
                        print(
                            f"trial {trial + 1}/{trials} {effect:4} {design:10}: "
                            f"{out['verdict']:12} ratio {out['ratio']:.4f} after "
                            f"{out['blocks']:2} blocks ({out['stop']}), {out['gpu_s']:.1f} GPU s",
                            file=sys.stderr,
                        )
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(root)

    def gpu(design: str, effect: str) -> float:
        return statistics.fmean(t["gpu_s"] for t in seen[design][effect])

    def rate(design: str, effect: str, hit: Any) -> float:
        rows = seen[design][effect]
        return sum(bool(hit(t["verdict"])) for t in rows) / len(rows)

    per_effect = {e: gpu("sequential", e) / gpu("fixed", e) for e in EFFECTS}
    ratio = statistics.fmean(per_effect.values())
    measured = {
        design: {
            "gpu_s_per_decision": {e: round(gpu(design, e), 3) for e in EFFECTS},
            "blocks_mean": {
                e: round(statistics.fmean(t["blocks"] for t in seen[design][e]), 2) for e in EFFECTS
            },
            "detection_rate_5": rate(design, "5%", lambda v: v == "slower"),
            "detection_rate_30": rate(design, "30%", lambda v: v == "slower"),
            "false_positive_rate": rate(design, "none", lambda v: v != "inconclusive"),
        }
        for design in designs
    }
    seq, fixed = measured["sequential"], measured["fixed"]
    met = (
        ratio <= GOAL["ratio_max"]
        and per_effect["30%"] <= GOAL["ratio_30_max"]
        and seq["detection_rate_5"] >= max(GOAL["detection_rate_min"], fixed["detection_rate_5"])
        and seq["false_positive_rate"] <= GOAL["false_positive_rate_max"]
    )
    report = {
        "benchmark": "decision_cost",
        "quick": args.quick,
        "sandbox": args.sandbox,
        "trials": trials,
        "max_blocks": MAX_BLOCKS,
        "script": {"n": args.n, "reps": args.reps},
        "measured": measured,
        "ratio_by_effect": {e: round(r, 4) for e, r in per_effect.items()},
        "ratio": round(ratio, 4),
        "ratio_30": round(per_effect["30%"], 4),
        "detection_rate": seq["detection_rate_5"],
        "false_positive_rate": seq["false_positive_rate"],
        "goal": GOAL,
        "goal_met": met,
        "duration_s": round(time.monotonic() - started, 1),
        "machine": machine("cpu", "cores", "python", "os"),
        "date": today(),
    }
    print_json(report, indent=None if args.json else 2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
