"""The quality gate of a command experiment: the candidate's median check value against the
baseline's, within a relative tolerance (docs/design.md, "Accuracy gates before speed"). The
judge applies it to a job's whole result; the runner and
the judge apply it after each block of a job whose blocks stop when decided."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

from app.cycles.exceptions import Unjudgeable


def check_gate(wanted: Any, raw: Any) -> dict[str, Any] | None:
    """The check gate the spec asks for, on the runs' check values; None without one."""
    if wanted is None:
        return None
    if not isinstance(wanted, Mapping) or wanted.get("direction") not in ("lower", "higher"):
        raise Unjudgeable(f"the job's spec has check {wanted!r}; expected direction and tolerance")
    tolerance = wanted.get("tolerance")
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float) or tolerance < 0:
        raise Unjudgeable(f"the job's spec has check tolerance {tolerance!r}; expected >= 0")
    if not isinstance(raw, Mapping):
        raise Unjudgeable("checks is missing: the spec gates on a check value each run reports")
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
        raise Unjudgeable(f"{where} must be a non-empty list of the runs' check values")
    for i, value in enumerate(raw):
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else None
        if number is None or not math.isfinite(number):
            raise Unjudgeable(f"{where}[{i}] is not a finite number: {str(value)[:40]!r}")
    return [float(v) for v in raw]
