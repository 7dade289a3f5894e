"""False keeps per research campaign, and real improvements kept, under the keep rule.

**A simulation of samples, not GPU jobs.** Each run's value is drawn from a noise model; all
that follows the draw is the service's own code, as a campaign would run it:

- the spec: an `autopilot.toml` experiment (`metric_source = "wall"`, `stopping =
  "sequential"`, 20 blocks at most) through `app.projects.config.parse` and
  `app.jobs.service.command_spec`, with a fresh seed per comparison;
- the runner: `workers.blocks.run_until_decided` over `app.projects.command.schedule`'s seeded
  order of runs, stopping the blocks by the rule (`autopilot_harness.sequential`, asked through
  `app.jobs.stopping.decide` after each block); only `Arms.run_one` is replaced, by a
  draw from the noise model;
- the judge: `app.cycles.judge.command.judge_command` on the raw result (it re-checks the stop);
- the keep rule: `app.cycles.judge.keep` (`needs_confirmation`, then a confirmation comparison
  on fresh blocks with a new seed, then `decide`).

The noise model (knobs below): a run takes 100 s x its arm's true ratio x exp(machine state +
within-run noise); the machine state is an AR(1) over the runs, shared by all runs
(`--drift`, its stationary s.d.; correlation 0.95 from one run to the next, so it drifts between
blocks, which the pairing cancels, and a little within one); the within-run noise is log-normal
with CV `--cv`; and a share `--slow-share` of runs hit a slow spell, 1.2-1.6x longer (the
shared hosts of docs/benchmarks.md, "command_power", have such spells).

Scenarios, each over `--campaigns` campaigns of `--steps` steps:

- `null`: no step has an effect: every keep is a false keep;
- `mixed`: every fifth step is a real 10% speed-up (ratio 0.9), the others have none.

The baseline, judged on the same comparisons: the naive rule, which keeps a step on one trusted
win with no confirmation. `ratio` = our false keeps per null step over the naive rule's. Blocks
are counted per step, the confirmation's included (the fixed design runs 20 per comparison).

    python bench/campaign_error.py [--quick] [--json] [--seed S] [--campaigns N] [--steps N]
                                   [--cv CV] [--drift D] [--slow-share P]
"""

from __future__ import annotations

import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from _common import bench_parser, machine, print_json, today

from app.cycles.judge import keep
from app.cycles.judge.command import judge_command
from app.jobs import stopping
from app.jobs.service import command_spec
from app.projects import command as command_kind
from app.projects.config import Experiment, parse
from workers import blocks
from workers.arms import by_role

MAX_BLOCKS = 20
REAL_RATIO = 0.9
REAL_EVERY = 5
RHO = 0.95  # the machine state's correlation from one run to the next
BASE_S = 100.0
GOAL = {"false_keeps_per_campaign_max": 2, "detection_rate_min": 0.9}

CONFIG = f"""
[project]
name = "campaign-error"
gpu_kind = "cpu"

[experiments.step]
kind = "command"
command = ["python", "train.py", "--variant={{variant}}"]
metric = "step_time"
metric_source = "wall"
direction = "lower"
repeats = {MAX_BLOCKS}
warmup_runs = 1
time_limit_s = 600
stopping = "sequential"

[experiments.step.parameters]
variant = ["a", "b"]

[experiments.step.defaults]
variant = "a"
"""


@dataclass
class Machine:
    """The noise model: one machine a campaign's jobs run on, one after another."""

    cv: float
    drift: float
    slow_share: float
    rng: np.random.Generator
    state: float = 0.0

    def run(self, ratio: float) -> float:
        """One run of an arm whose true time is `ratio` x the baseline's."""
        rng = self.rng
        self.state = RHO * self.state + math.sqrt(1 - RHO**2) * self.drift * rng.standard_normal()
        value = BASE_S * ratio * math.exp(self.state + self.cv * rng.standard_normal())
        if rng.random() < self.slow_share:
            value *= rng.uniform(1.2, 1.6)
        return value


@dataclass
class SimulatedArms:
    """What `blocks.run_until_decided` asks of `workers.arms.Arms`, each run a draw."""

    machine: Machine
    ratio: float  # the candidate's true ratio
    log: Any = None
    spent: int = 0

    def cancelled(self) -> bool:
        return False

    def run_one(self, run: command_kind.Run, total: int) -> dict[str, Any]:
        self.spent += 1
        value = self.machine.run(self.ratio if run.arm == "candidate" else 1.0)
        return {"index": run.index, "arm": run.arm, "role": run.role, "block": run.block,
                "value": value, "check": None}  # fmt: skip


def comparison(
    exp: Experiment, machine: Machine, ratio: float, seed: int, commits: tuple[str, str]
) -> tuple[dict[str, Any], int]:
    """One command job, candidate at true `ratio`: the judged result and its whole blocks."""
    spec = {**command_spec(exp), "seed": seed}
    plan = command_kind.schedule(exp.repeats, exp.warmup_runs, seed)
    arms = SimulatedArms(machine, ratio)
    records, stop = blocks.run_until_decided(arms, plan, stopping.rule_of(spec), seed)  # type: ignore[arg-type]
    result: dict[str, Any] = {
        "status": "ok",
        "kind": "command",
        "metric": exp.metric,
        "metric_source": exp.metric_source,
        "arms": {"baseline": {"commit": commits[0]}, "candidate": {"commit": commits[1]}},
        "samples": {role: by_role(records, role) for role in blocks.BLOCK_ROLES},
    }
    if stop is not None:
        result["stopped"] = {"blocks": stop[1].blocks, "decision": stop[0]}
    return judge_command(result, spec), blocks.whole_blocks(records)


@dataclass
class StepSeen:
    real: bool
    kept: bool
    naive_kept: bool
    reason: str | None
    blocks: int  # the step's comparison and its confirmation
    comparisons: int
    floor_clear: bool | None = None  # kept: did the step's interval clear the A/A floor too?


@dataclass
class CampaignSeen:
    steps: list[StepSeen] = field(default_factory=list)

    def false_keeps(self, naive: bool = False) -> int:
        return sum((s.naive_kept if naive else s.kept) and not s.real for s in self.steps)


def campaign(exp: Experiment, args: Any, seed: int, real_every: int | None) -> CampaignSeen:
    """One campaign: `args.steps` steps from the line's tip, in order."""
    draws = random.Random(seed)
    machine = Machine(args.cv, args.drift, args.slow_share, np.random.default_rng(seed))
    tip, seen = "base", CampaignSeen()
    for i in range(args.steps):
        real = real_every is not None and (i + 1) % real_every == 0
        ratio = REAL_RATIO if real else 1.0
        head = f"step-{i}"
        judged, used = comparison(exp, machine, ratio, draws.randrange(1, 2**31), (tip, head))
        step = keep.Comparison.from_judged(judged)
        confirmation, runs = None, 1
        if keep.needs_confirmation(step):
            again, more = comparison(exp, machine, ratio, draws.randrange(1, 2**31), (tip, head))
            confirmation, runs, used = keep.Comparison.from_judged(again), 2, used + more
        outcome = keep.decide(step, confirmation)
        reason = outcome.reason if isinstance(outcome, keep.Discard) else None
        clear = None
        if outcome.kept:
            tip = head
            clear = step.assured_gain > step.floor
        seen.steps.append(
            StepSeen(real, outcome.kept, keep.needs_confirmation(step), reason, used, runs, clear)
        )
    return seen


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% at z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def summary(prefix: str, runs: list[CampaignSeen], steps: int) -> dict[str, Any]:
    """The flat figures of one scenario's campaigns."""
    every = [s for c in runs for s in c.steps]
    null = [s for s in every if not s.real]
    real = [s for s in every if s.real]
    fk = [c.false_keeps() for c in runs]
    naive = [c.false_keeps(naive=True) for c in runs]
    low, high = wilson(sum(fk), len(null))
    out: dict[str, Any] = {
        f"{prefix}_campaigns": len(runs),
        f"{prefix}_no_effect_steps": len(null),
        f"{prefix}_false_keeps": sum(fk),
        f"{prefix}_false_keeps_per_campaign_mean": round(statistics.fmean(fk), 4),
        f"{prefix}_false_keeps_per_campaign_max": max(fk),
        f"{prefix}_share_campaigns_over_2": round(sum(k > 2 for k in fk) / len(runs), 4),
        f"{prefix}_false_keep_rate": round(sum(fk) / len(null), 6),
        f"{prefix}_false_keep_rate_ci_low": round(low, 6),
        f"{prefix}_false_keep_rate_ci_high": round(high, 6),
        f"{prefix}_naive_false_keeps_per_campaign_mean": round(statistics.fmean(naive), 4),
        f"{prefix}_naive_false_keeps_per_campaign_max": max(naive),
        f"{prefix}_naive_share_campaigns_over_2": round(sum(k > 2 for k in naive) / len(runs), 4),
        f"{prefix}_naive_false_keep_rate": round(sum(naive) / len(null), 6),
        f"{prefix}_blocks_per_null_step": round(statistics.fmean(s.blocks for s in null), 2),
        f"{prefix}_confirmations_per_null_step": round(
            statistics.fmean(s.comparisons - 1 for s in null), 4
        ),
    }
    for reason in keep.REASONS:
        out[f"{prefix}_no_effect_discards_{reason}"] = sum(s.reason == reason for s in null)
    if real:
        kept = sum(s.kept for s in real)
        d_low, d_high = wilson(kept, len(real))
        positions = [i for i in range(steps) if (i + 1) % REAL_EVERY == 0]
        by_position = [sum(c.steps[i].kept for c in runs) / len(runs) for i in positions]
        clear = [s.floor_clear for s in real if s.kept]
        out |= {
            f"{prefix}_real_steps": len(real),
            f"{prefix}_detection_rate": round(kept / len(real), 4),
            f"{prefix}_detection_rate_ci_low": round(d_low, 4),
            f"{prefix}_detection_rate_ci_high": round(d_high, 4),
            f"{prefix}_detection_rate_worst_position": round(min(by_position), 4),
            f"{prefix}_share_campaigns_keeping_every_real_step": round(
                sum(all(c.steps[i].kept for i in positions) for c in runs) / len(runs), 4
            ),
            f"{prefix}_naive_detection_rate": round(sum(s.naive_kept for s in real) / len(real), 4),
            f"{prefix}_blocks_per_real_step": round(statistics.fmean(s.blocks for s in real), 2),
            f"{prefix}_kept_real_whose_interval_clears_the_floor": round(
                sum(bool(c) for c in clear) / max(1, len(clear)), 4
            ),
        }
        for reason in keep.REASONS:
            out[f"{prefix}_real_discards_{reason}"] = sum(s.reason == reason for s in real)
    return out


def parse_args() -> Any:
    parser = bench_parser(__doc__, quick="25 campaigns of each scenario (the full run: 200)")
    parser.add_argument("--campaigns", type=int, default=None, help="campaigns per scenario")
    parser.add_argument("--steps", type=int, default=40, help="steps per campaign")
    parser.add_argument("--cv", type=float, default=0.03, help="within-run noise (CV)")
    parser.add_argument("--drift", type=float, default=0.05, help="machine drift (s.d.)")
    parser.add_argument("--slow-share", type=float, default=0.02, help="runs in a slow spell")
    parser.add_argument("--seed", type=int, default=20261206, help="draws every campaign")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    campaigns = args.campaigns or (25 if args.quick else 200)
    exp = parse(CONFIG).experiment("step")
    seeds = random.Random(args.seed)
    started = time.monotonic()
    seen: dict[str, list[CampaignSeen]] = {"null": [], "mixed": []}
    for k in range(campaigns):
        for scenario, every in (("null", None), ("mixed", REAL_EVERY)):
            seen[scenario].append(campaign(exp, args, seeds.randrange(1, 2**31), every))
        if not args.json:
            null, mixed = seen["null"][-1], seen["mixed"][-1]
            print(
                f"campaign {k + 1}/{campaigns}: null {null.false_keeps()} false keeps "
                f"(naive {null.false_keeps(naive=True)}); mixed "
                f"{sum(s.kept for s in mixed.steps if s.real)}/"
                f"{sum(s.real for s in mixed.steps)} real kept, {mixed.false_keeps()} false; "
                f"{time.monotonic() - started:.0f} s",
                file=sys.stderr,
            )
    budget = keep.DEFAULT_BUDGET
    report: dict[str, Any] = {
        "benchmark": "campaign_error",
        "simulated": True,
        "quick": args.quick,
        "seed": args.seed,
        "steps": args.steps,
        "max_blocks": MAX_BLOCKS,
        "cv": args.cv,
        "drift": args.drift,
        "slow_share": args.slow_share,
        "real_ratio": REAL_RATIO,
        "alpha": budget.alpha,
        "bound_false_keep_rate": budget.per_step,
        "bound_false_keeps_per_campaign_mean": budget.expected_false_keeps(args.steps),
        "bound_share_campaigns_over_2": budget.chance_of_more_than(2, args.steps),
        **summary("null", seen["null"], args.steps),
        **summary("mixed", seen["mixed"], args.steps),
    }
    rate = report["null_false_keep_rate"]
    naive = report["null_naive_false_keep_rate"]
    report["ratio"] = round(rate / naive, 4) if naive else None
    report["goal_met"] = (
        max(
            report["null_false_keeps_per_campaign_max"],
            report["mixed_false_keeps_per_campaign_max"],
        )
        <= GOAL["false_keeps_per_campaign_max"]
        and report["mixed_detection_rate"] >= GOAL["detection_rate_min"]
        and report["mixed_detection_rate_worst_position"] >= GOAL["detection_rate_min"]
    )
    report["duration_s"] = round(time.monotonic() - started, 1)
    report |= machine("cpu", "cores", "python")
    report["date"] = today()
    if args.json:
        print_json(report)
    else:
        width = max(map(len, report))
        for key, value in report.items():
            print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
