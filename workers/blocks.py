"""A job's runs, block after block, stopped when the comparison is decided (docs/design.md,
"Sequential verdicts").

The runner is ours, not the candidate's: after each whole block (one baseline, one candidate
and one A/A baseline run) from the rule's first look on, it asks the stopping rule
(`app.jobs.stopping`) about the values so far, and stops the job's runs when the rule
stops: an effect, an equivalence within the margin, or the maximum; a quality gate that fails
at a look stops them at once (the candidate is rejected whatever its speed). The control plane
asks the same rule the same question of the recorded samples and refuses a stop it does not
reproduce, so a forged early end buys nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autopilot_harness import sequential

from app.jobs import stopping
from app.projects import command as command_kind
from workers.arms import Arms, by_role

#: The roles of one block; a block is whole when it has a record of each.
BLOCK_ROLES = ("baseline", "candidate", "baseline_aa")


def whole_blocks(records: Sequence[Mapping[str, Any]]) -> int:
    """How many blocks have a run of every role."""
    seen: dict[int, set[str]] = {}
    for record in records:
        if record.get("block") is not None:
            seen.setdefault(int(record["block"]), set()).add(str(record["role"]))
    return sum(1 for roles in seen.values() if roles >= set(BLOCK_ROLES))


#: Where and why a job's blocks stopped: the decision (an effect, equivalent, max, or gate)
#: and the rule's look at that block.
Stop = tuple[str, sequential.Look]


def run_until_decided(
    arms: Arms,
    plan: Sequence[command_kind.Run],
    rule: sequential.Rule | None,
    seed: int,
    gate: Mapping[str, Any] | None = None,
) -> tuple[list[dict[str, Any]], Stop | None]:
    """Every run's record, in order, and where and why they stopped (None: the plan ran out,
    or no rule). `gate` is the spec's quality gate (`check`), applied at each look. Without a
    rule this is `arms.run(plan)`. RunFailed from a run goes up."""
    if rule is None:
        return arms.run(plan), None
    records: list[dict[str, Any]] = []
    counted = 0
    for run in plan:
        if arms.cancelled():
            break
        record = arms.run_one(run, len(plan))
        if arms.cancelled():
            break
        records.append(record)
        blocks = whole_blocks(records)
        if blocks == counted or blocks < rule.min_blocks:
            counted = blocks
            continue
        counted = blocks
        values = {role: by_role(records, role) for role in BLOCK_ROLES}
        checks = {arm: by_role(records, arm, "check") for arm in ("baseline", "candidate")}
        decision, at = stopping.decide(rule, values, checks if gate else None, gate, seed)
        if decision != "continue":
            if arms.log is not None:
                arms.log.write(f"[stop] {describe(decision, at, rule)}\n")
                arms.log.flush()
            return records, (decision, at)
    return records, None


def describe(decision: str, at: sequential.Look, rule: sequential.Rule) -> str:
    """Why a comparison stopped where it did, for the job log and the report."""
    why = {
        "effect": f"|t| {abs(at.t):.2f} reached the boundary {at.boundary:.2f} and the ratio "
        f"{at.ratio:.4f} clears the A/A noise floor {at.floor:.4f}",
        "equivalent": f"the interval [{at.ci_low:.4f}, {at.ci_high:.4f}] lies within "
        f"±{rule.margin:.1%}",
        "max": f"the maximum of {rule.max_blocks} blocks was reached undecided",
        "gate": "the quality gate failed: the candidate's check value is worse than the "
        "baseline's beyond the tolerance",
        "continue": "it had not stopped",
    }[decision]
    return f"after {at.blocks} of at most {rule.max_blocks} blocks: {decision}: {why}"
