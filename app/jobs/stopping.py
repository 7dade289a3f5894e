"""When a job's blocks stop (docs/design.md, "Sequential verdicts"): the stopping rule and the
quality gate its spec carries, read and asked here for both sides. The GPU host's runner asks
after each block (`workers/blocks.py`); the control plane's judge asks the same of the recorded
values and refuses a stop it does not reproduce (`app/cycles/judge/sequential.py`). One parser
and one decision, so the two cannot drift apart; the statistics are the harness's
(`autopilot_harness.sequential`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from autopilot_harness import sequential


class Unusable(ValueError):
    """The spec's stopping rule or quality gate cannot be used, or the check values the gate is
    given cannot be compared. The judge refuses the result with this message; the runner fails
    the job with it."""


def rule_of(spec: Mapping[str, Any]) -> sequential.Rule | None:
    """The stopping rule the control plane wrote in a job's spec (None: a fixed design)."""
    raw = spec.get("sequential")
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise Unusable(f"the job's spec has sequential {raw!r}; expected a table of the rule")
    try:
        return sequential.Rule.from_dict(raw)
    except sequential.RuleError as exc:
        raise Unusable(f"the job's spec has an unusable stopping rule: {exc}") from None


def decide(
    rule: sequential.Rule,
    values: Mapping[str, Sequence[float]],
    checks: Mapping[str, Sequence[float]] | None,
    gate: Any,
    seed: int,
) -> tuple[str, sequential.Look]:
    """The decision after all the blocks given: `gate` when the spec's quality gate (`gate`,
    the spec's `check`) fails on their check values, else the rule's look ("continue" goes on).
    The runner asks it after each block; the judge, of every look the values allow."""
    at = sequential.look(
        rule, values["baseline"], values["candidate"], values["baseline_aa"], seed=seed
    )
    if gate is not None and not check_gate(gate, checks)["pass"]:  # type: ignore[index]
        return "gate", at
    return at.decision, at


def check_gate(wanted: Any, raw: Any) -> dict[str, Any] | None:
    """The quality gate of a command experiment (docs/design.md, "Accuracy gates before
    speed"): the candidate's median check value against the baseline's, within the relative
    tolerance the spec asks for; None without one. The judge applies it to a job's whole
    result; the runner and the judge, after each block of a job whose blocks stop when
    decided."""
    if wanted is None:
        return None
    if not isinstance(wanted, Mapping) or wanted.get("direction") not in ("lower", "higher"):
        raise Unusable(f"the job's spec has check {wanted!r}; expected direction and tolerance")
    tolerance = wanted.get("tolerance")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
        raise Unusable(f"the job's spec has check tolerance {tolerance!r}; expected >= 0")
    if not isinstance(raw, Mapping):
        raise Unusable("checks is missing: the spec gates on a check value each run reports")
    base = finite(raw.get("baseline"), "checks.baseline")
    cand = finite(raw.get("candidate"), "checks.candidate")
    base_median, cand_median = statistics.median(base), statistics.median(cand)
    slack = float(tolerance) * abs(base_median)
    lower = wanted["direction"] == "lower"
    passed = cand_median <= base_median + slack if lower else cand_median >= base_median - slack
    reason = None
    if not passed:
        reason = (
            f"the candidate's median check value {cand_median:.6g} is worse than the "
            f"baseline's {base_median:.6g} beyond the {float(tolerance):.3g} relative tolerance "
            f"({'lower' if lower else 'higher'} is better)"
        )
    return {
        "metric": raw.get("metric", "check"),
        "direction": wanted["direction"],
        "tolerance": float(tolerance),
        "baseline": base_median,
        "candidate": cand_median,
        "pass": passed,
        "reason": reason,
    }


def finite(raw: Any, where: str) -> list[float]:
    if not isinstance(raw, list) or not raw:
        raise Unusable(f"{where} must be a non-empty list of the runs' check values")
    for i, value in enumerate(raw):
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise Unusable(f"{where}[{i}] is not a finite number: {str(value)[:40]!r}")
    return [float(v) for v in raw]
