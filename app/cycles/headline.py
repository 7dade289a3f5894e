"""A verdict's headline: the figures picked from a (judged) result, and how they are written for
people. The cycle keeps the headline of the result `judge.py` judged, never of the raw report."""

from __future__ import annotations

from typing import Any

from app.cycles.judge.harness import disagreements
from app.cycles.models import Cycle


def headline(result: dict[str, Any]) -> dict[str, Any]:
    keys = ("ratio", "ci_low", "ci_high", "verdict")
    picked = {k: result.get(k) for k in keys if result.get(k) is not None}
    if isinstance(result.get("headline"), dict):
        picked = {**result["headline"], **picked}
    noise = result.get("noise_floor")
    # The harness's noise_floor is a section (estimate, floor, samples); the headline keeps
    # only the floor.
    floor = noise.get("floor") if isinstance(noise, dict) else noise
    if floor is not None:
        picked["noise_floor"] = floor
    accuracy = result.get("accuracy")
    if isinstance(accuracy, dict):
        picked["accuracy_pass"] = all(
            bool(v.get("pass", True)) for v in accuracy.values() if isinstance(v, dict)
        )
    environment = result.get("environment")
    if isinstance(environment, dict):
        picked["device"] = environment.get("device_name") or environment.get("device")
    if lines := disagreements(result):
        picked["disagreements"] = len(lines)
    return picked


def interval_text(headline_: dict[str, Any] | None) -> str | None:
    """`1.023 [0.998, 1.051]`: the ratio and its confidence interval, or None if either is
    missing."""
    h = headline_ or {}
    try:
        return f"{float(h['ratio']):.3f} [{float(h['ci_low']):.3f}, {float(h['ci_high']):.3f}]"
    except (KeyError, TypeError, ValueError):
        return None


def ratio_text(headline_: dict[str, Any] | None) -> str:
    """The ratio as PR titles, verdict statements and merge notes write it."""
    interval = interval_text(headline_)
    return f"ratio {interval}" if interval else "no ratio"


def trust_note(headline_: dict[str, Any] | None) -> str:
    """` (self-reported: not a trusted win)` where the verdict's numbers include the
    candidate's own word (docs/design.md, "Where a number comes from"), else nothing."""
    if (headline_ or {}).get("trusted") is False:
        return " (self-reported: not a trusted win)"
    return ""


def verdict_statement(cycle: Cycle) -> str:
    """The verdict finding's statement. It names its cycle: memory keys a finding on its
    statement, and two cycles at one point (two code changes, or a rerun with a changed
    hypothesis) that measure alike are two findings, each reviewed on its own."""
    params = ", ".join(f"{k}={v}" for k, v in sorted((cycle.parameters or {}).items()))
    return (
        f"{cycle.experiment} ({params}): {cycle.verdict}{trust_note(cycle.headline)}, "
        f"{ratio_text(cycle.headline)} (cycle {cycle.id})"
    )
