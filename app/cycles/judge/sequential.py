"""The control plane's check of where a job's runs stopped (docs/design.md, "Sequential
verdicts").

A job whose spec carries a stopping rule ran its blocks until the rule stopped them; the runner
says where and why in the result's `stopped`. The judge asks the runner's own question
(`app.jobs.stopping.decide`, with the spec's seed, rule and gate, never the result's copy) of
the recorded values, and:

- where the rule stops at the block the values end with, the verdict is the rule's: an effect
  is `faster` or `slower` by its sign, an equivalence or the maximum is `inconclusive`; a
  quality gate that fails at a look stops the blocks there (`gate`), and the verdict is
  `rejected_accuracy`;
- anything else is refused (`Unjudgeable`): values that end before the rule stops (a forged
  early end), values that go on past where it stopped, or a stop claimed for another reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autopilot_harness import sequential

from app.cycles.exceptions import Unjudgeable
from app.jobs import stopping

#: Why blocks stop: the rule's decisions, and a quality gate that failed at a look.
DECISIONS = ("effect", "equivalent", "max", "gate")


def judge_stop(
    rule: sequential.Rule,
    values: Mapping[str, Sequence[float]],
    claimed: Any,
    seed: int,
    *,
    checks: Mapping[str, Sequence[float]] | None = None,
    gate: Any = None,
) -> dict[str, Any]:
    """The rule's own looks at the recorded values (by role; the check values by arm with a
    gate), checked against the runner's claimed stop; what the judged result shows of it."""
    n = len(values["baseline"])
    if n < rule.min_blocks:
        raise Unjudgeable(
            f"the runs stopped after {n} blocks, before the rule's first look at "
            f"{rule.min_blocks}: the rule does not support that stop"
        )
    found: tuple[str, sequential.Look] | None = None
    try:
        for k in range(rule.min_blocks, min(n, rule.max_blocks) + 1):
            seen = {role: list(v)[:k] for role, v in values.items()}
            gated = {arm: list(v)[:k] for arm, v in checks.items()} if checks else None
            decision, at = stopping.decide(rule, seen, gated, gate, seed)
            if decision != "continue":
                found = decision, at
                break
    except sequential.RuleError as exc:
        raise Unjudgeable(f"the stopping rule cannot read the samples: {exc}") from None
    except stopping.Unusable as exc:  # the quality gate's, at a look
        raise Unjudgeable(str(exc)) from None
    if found is None:
        raise Unjudgeable(
            f"the runs stopped after {n} of at most {rule.max_blocks} blocks, but the rule "
            "goes on there: the rule does not support that stop"
        )
    decision, at = found
    if at.blocks != n:
        raise Unjudgeable(
            f"the rule stops after {at.blocks} blocks ({decision}), but {n} blocks were "
            "recorded: the runs do not end where the rule stopped them"
        )
    if isinstance(claimed, Mapping) and claimed.get("decision") not in (None, decision):
        raise Unjudgeable(
            f"the runner says it stopped for {claimed.get('decision')!r}, the rule for {decision!r}"
        )
    verdict = "inconclusive"
    if decision == "gate":
        verdict = "rejected_accuracy"
    elif decision == "effect":
        verdict = "faster" if at.ratio < 1.0 else "slower"
    return {
        **at.as_dict(),
        "decision": decision,
        "verdict": verdict,
        "rule": rule.as_dict(),
        "blocks_saved": rule.max_blocks - at.blocks,
    }
