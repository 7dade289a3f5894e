"""The control plane's judgement of a command experiment (docs/design.md, "Experiment kinds" and
"The code under test never
judges itself"): candidate arm against baseline arm, from every run's value.

The GPU host's runner read one value per run from the program's output and recorded them by
arm and role (`workers/command_runs.py`); the program itself claims nothing. Judged here, with
the harness's statistics (`autopilot_harness.stats`) and the job's spec (what the control plane
wrote at submission: direction, check gate, seed), never the result's own copy of them:

- the ratio candidate / baseline: the median of the per-block paired ratios, with its
  bootstrap 95% CI (seed = spec seed + 1);
- the A/A noise floor: the second baseline run of each block against the first (seed = spec
  seed);
- the check gate first: the candidate's median check value may not be worse than the
  baseline's beyond the relative tolerance; a failed gate is `rejected_accuracy`;
- then the verdict: `faster`/`slower` for a time metric, `better`/`worse` otherwise, only when
  the whole CI clears 1 and the ratio clears the noise floor; `inconclusive` otherwise;
- and where each number came from (docs/design.md, "Where a number comes from"): a metric or
  check value read from the output of code the cycle changed (the candidate's commit is not
  the baseline's) is *self-reported*, and the judgement is then not `trusted`, whatever its
  verdict: the verdict word stays what the figures say, and `trusted` is what a keep (research
  lines) checks.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from autopilot_harness import stats

from app.cycles.exceptions import Unjudgeable
from app.cycles.judge.figures import FIGURES, JUDGE, MAX_PAIRS
from app.cycles.judge.sequential import judge_stop
from app.jobs import stopping

ROLES = ("baseline", "candidate", "baseline_aa")
#: Where a judged number may come from: a command's three, and a harness entry at two commits.
SOURCES = ("output", "wall", "evaluator", "harness")
#: The verdicts that claim an improvement: only a trusted one may ever be kept.
WINS = ("faster", "better")


def judge_command(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The judged copy of a command job's `result` under its `spec`."""
    judged = copy.deepcopy(dict(result))
    if result.get("status") != "ok":
        return judged
    seed = spec.get("seed", 0) or 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise Unjudgeable(f"the job's spec has seed {seed!r}; a seed is an integer >= 0")
    direction = spec.get("direction")
    if direction not in ("lower", "higher"):
        raise Unjudgeable(f"the job's spec has direction {direction!r}; expected lower or higher")
    samples = result.get("samples")
    if not isinstance(samples, Mapping):
        raise Unjudgeable("samples is missing: a command result holds each run's value by role")
    values = {role: _values(samples.get(role), f"samples.{role}") for role in ROLES}
    lengths = {len(v) for v in values.values()}
    if len(lengths) != 1:
        raise Unjudgeable(
            "samples: the roles hold "
            + ", ".join(f"{role} {len(v)}" for role, v in values.items())
            + " values; each block has one run of each"
        )
    noise = stats.estimate_ratio(values["baseline"], values["baseline_aa"], seed=seed)
    floor = stats.noise_floor(noise)
    estimate = stats.estimate_ratio(values["baseline"], values["candidate"], seed=seed + 1)
    integrity = _integrity(result, spec)
    try:
        check = stopping.check_gate(spec.get("check"), result.get("checks"))
        rule = stopping.rule_of(spec)
    except stopping.Unusable as exc:
        raise Unjudgeable(str(exc)) from None
    passed = check is None or bool(check["pass"])
    if rule is None:
        decided = stats.decide(estimate, floor, accuracy_pass=passed)
        judged.update(estimate.as_dict())
    else:  # the blocks stopped when decided: the rule's own look, its stop checked
        stop = judge_stop(
            rule,
            values,
            result.get("stopped"),
            seed,
            checks=result.get("checks") if check is not None else None,
            gate=spec.get("check"),
        )
        decided = stop["verdict"] if passed else "rejected_accuracy"
        judged.update({k: stop[k] for k in ("ratio", "ci_low", "ci_high")}, n=stop["blocks"])
        judged["stopped"] = stop
    verdict = _word(decided, direction, bool(spec.get("time_metric")))
    judged["verdict"] = verdict
    judged["noise_floor"] = {**noise.as_dict(), "floor": floor}
    if check is not None:
        judged["check"] = check
    trusted = {k: integrity[k] for k in ("metric_source", "self_reported", "trusted")}
    judged.update(trusted)
    judged["integrity"] = integrity
    judged["headline"] = {
        "kind": "command",
        "metric": spec.get("metric") or result.get("metric"),
        "variant": "candidate",
        "baseline": "baseline",
        **{k: judged[k] for k in FIGURES},
        "verdict": verdict,
        "noise_floor": floor,
        "accuracy_pass": passed,
        **trusted,
    }
    if rule is not None:
        judged["headline"]["stopped"] = {
            k: judged["stopped"][k] for k in ("blocks", "decision", "blocks_saved")
        } | {"max_blocks": rule.max_blocks}
    judged["judgement"] = {
        "by": JUDGE,
        "seed": seed,
        "direction": direction,
        "self_reported": {},
        "disagreements": [],
        "not_judged": [],
    }
    return judged


def _integrity(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """Where the metric and the check value came from, whether either is the candidate's own
    word, and so whether the judgement may be trusted for a keep. The sources are the spec's
    (the control plane's copy of the config); the runner's record must agree with them."""
    source = spec.get("metric_source") or "output"
    if source not in SOURCES:
        raise Unjudgeable(f"the job's spec has metric_source {source!r}; expected {SOURCES}")
    recorded = result.get("metric_source")  # None: a result recorded before sources were
    if recorded is not None and recorded != source:
        raise Unjudgeable(
            f"the runner read the metric from {recorded!r}, but the job's spec says "
            f"metric_source = {source!r}: the head's autopilot.toml is not the one submitted"
        )
    wanted = spec.get("check")
    check_source = None
    if isinstance(wanted, Mapping):
        check_source = str(wanted.get("source") or "output")
        recorded_check = result.get("check_source")
        if recorded_check is not None and recorded_check != check_source:
            raise Unjudgeable(
                f"the runner read the check value from {recorded_check!r}, but the job's spec "
                f"says {check_source!r}"
            )
    arms = result.get("arms")
    commits = {
        arm: (arms.get(arm) or {}).get("commit") if isinstance(arms, Mapping) else None
        for arm in ("baseline", "candidate")
    }
    changed = commits["baseline"] != commits["candidate"]
    metric = spec.get("metric") or result.get("metric") or "the metric"
    flags: list[str] = []
    where = (
        f"(candidate at {str(commits['candidate'])[:12]}, base at {str(commits['baseline'])[:12]})"
    )
    self_reported = source == "output" and changed
    if self_reported:
        flags.append(
            f"self-reported: `{metric}` was read from the output of code the cycle changed "
            f"{where}; the candidate can print any number, so this is never a trusted win "
            "(declare metric_source = 'wall' or 'evaluator')"
        )
    check_self_reported = check_source == "output" and changed
    if check_self_reported:
        flags.append(
            "self-reported check: the quality gate's value was read from the output of code "
            f"the cycle changed {where}; a gate the candidate can print is no gate (declare "
            "evaluator_check_pattern)"
        )
    return {
        "metric_source": source,
        "check_source": check_source,
        "changed_code": changed,
        "self_reported": self_reported,
        "check_self_reported": check_self_reported,
        "trusted": not (self_reported or check_self_reported),
        "flags": flags,
    }


def trusted_win(judged: Mapping[str, Any]) -> bool:
    """Whether a judged result is a win that may ever be kept: an improvement whose numbers
    came only from sources the candidate cannot write."""
    return judged.get("verdict") in WINS and judged.get("trusted") is not False


def _word(decided: str, direction: str, time_metric: bool) -> str:
    """`stats.decide` reads a ratio below 1 as `faster`; a higher-is-better metric improves
    above 1, and a metric that is not a time is better or worse, not faster or slower."""
    if decided not in ("faster", "slower"):
        return decided
    improved = (decided == "faster") == (direction == "lower")
    if time_metric and direction == "lower":
        return "faster" if improved else "slower"
    return "better" if improved else "worse"


def _values(raw: Any, where: str) -> list[float]:
    if not isinstance(raw, list):
        raise Unjudgeable(f"{where} must be a list of the runs' values")
    if len(raw) < 2:
        raise Unjudgeable(f"{where} has {len(raw)} value(s); a confidence interval needs 2")
    if len(raw) > MAX_PAIRS:
        raise Unjudgeable(f"{where} has {len(raw)} values, over the {MAX_PAIRS} judged")
    out = []
    for i, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Unjudgeable(f"{where}[{i}] is not a number: {str(value)[:40]!r}")
        if not math.isfinite(value) or value <= 0:
            raise Unjudgeable(
                f"{where}[{i}] is {value!r}: ratios need positive values (a time, a loss, a "
                "throughput); read a positive quantity from the program's output"
            )
        out.append(float(value))
    return out


def judge_head_vs_base(judged: dict[str, Any], spec: Mapping[str, Any]) -> None:
    """A harness result whose cycle changed code (the spec's `head_vs_base`), already judged in
    process: judge its `head_vs_base` section (the entry's headline variant timed at base and
    at head, arm against arm) and make that the verdict. The in-process figures stay in
    `comparisons` and under `headline.in_process`; the in-process accuracy gate still comes
    first. Where the in-process baseline itself moved between base and head, a reviewer is told
    that the in-process ratio measures against a changed baseline."""
    section = judged.get("head_vs_base")
    if not isinstance(section, Mapping):
        raise Unjudgeable(
            "head_vs_base is missing: the cycle changed code, so its entry runs at base and "
            "at head and the verdict is head against base"
        )
    seed = spec.get("seed", 0) or 0
    rules = {
        "seed": seed,
        "direction": "lower",
        "time_metric": True,
        "metric": "time_ns",
        "metric_source": "harness",
    }
    if "sequential" in spec:  # the arms' blocks stopped by the same rule
        rules["sequential"] = spec["sequential"]
    arms = judge_command({**section, "status": "ok"}, rules)
    in_process = dict(judged.get("headline") or {})
    passed = bool(in_process.get("accuracy_pass", True))
    if not passed:
        arms["verdict"] = arms["headline"]["verdict"] = "rejected_accuracy"
    arms["headline"]["accuracy_pass"] = passed
    judged["head_vs_base"] = arms
    judged.update({k: arms[k] for k in ("verdict", *FIGURES)})
    judged["headline"] = {
        **arms["headline"],
        "variant": in_process.get("variant"),
        "baseline": "base",
        "in_process": {
            k: in_process.get(k)
            for k in ("variant", "baseline", "verdict", *FIGURES, "noise_floor")
        },
    }
    moved = section.get("in_process_baseline")
    if isinstance(moved, Mapping):
        base = _values(moved.get("baseline"), "head_vs_base.in_process_baseline.baseline")
        head = _values(moved.get("candidate"), "head_vs_base.in_process_baseline.candidate")
        change = stats.estimate_ratio(base, head, seed=seed + 2)
        floor = float(arms["noise_floor"]["floor"])
        if stats.decide(change, floor, accuracy_pass=True) != "inconclusive":
            name = in_process.get("baseline") or "baseline"
            lines = judged.setdefault("judgement", {}).setdefault("disagreements", [])
            lines.append(
                f"The in-process baseline `{name}` itself takes {change.ratio:.3f}x as long at "
                f"head as at base [{change.ci_low:.3f}, {change.ci_high:.3f}]: the in-process "
                "ratio compares against a changed baseline; the verdict is head against base."
            )
