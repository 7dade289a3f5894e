"""Every state change of a job and of a cycle goes through its lifecycle: no module of app/ or
workers/ but the two lifecycles assigns a `.state`, or writes `state` in an UPDATE's values."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
OWNERS = {"app/jobs/lifecycle.py", "app/cycles/lifecycle.py"}
#: `.state` writes of records that are neither jobs nor cycles, each with its own small life.
OTHERS = {
    ("app/jobs/preparation.py", "row.state"): "a host's preparation of a job (JobPreparation)",
    ("app/forge/local.py", "row.state"): "a pull request of the local forge",
    ("app/cycles/campaigns/driver.py", "campaign.state"): "a campaign, through driver._move",
}


def _targets(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List):
        return [leaf for item in node.elts for leaf in _targets(item)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return [node]


def state_writes(source: str) -> list[tuple[int, str]]:
    """(line, what) of each write of a `state`: an assignment to an attribute `state` (tuple
    targets and augmented ones too), `setattr(x, "state", ...)`, and `.values(state=...)` or
    `.values({"state": ...})`. A constructor's `state=` (a new Job or Cycle) is no move."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [leaf for target in node.targets for leaf in _targets(target)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = _targets(node.target)
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "state":
                found.append((node.lineno, ast.unparse(target)))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "state"
        ):
            found.append((node.lineno, f"setattr({ast.unparse(node.args[0])}, 'state', ...)"))
        if isinstance(func, ast.Attribute) and func.attr == "values":
            named = any(k.arg == "state" for k in node.keywords)
            keyed = any(
                isinstance(arg, ast.Dict)
                and any(isinstance(k, ast.Constant) and k.value == "state" for k in arg.keys)
                for arg in [*node.args, *(k.value for k in node.keywords if k.arg is None)]
            )
            if named or keyed:
                found.append((node.lineno, "values(state=...)"))
    return found


def test_only_the_lifecycles_change_a_state() -> None:
    offenders = []
    for package in ("app", "workers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if name in OWNERS:
                continue
            for line, what in state_writes(path.read_text(encoding="utf-8")):
                if (name, what) not in OTHERS:
                    offenders.append(f"{name}:{line}: {what}")
    assert offenders == [], "move it through app/jobs/lifecycle.py or app/cycles/lifecycle.py"


def test_the_finder_sees_every_form_of_write() -> None:
    source = """
job.state = "failed"
job.state, job.finished_at = "cancelled", now
(a, [cycle.state, b]) = x
job.state += "x"
setattr(job, "state", "queued")
update(Job).where(Job.id == 1).values(state="leased", worker=w)
update(Job).values({"state": "running"})
update(Job).values(**{"state": "running"}, worker=w)
"""
    assert [line for line, _ in state_writes(source)] == [2, 3, 4, 5, 6, 7, 8, 9]


def test_the_finder_leaves_reads_filters_and_constructors_alone() -> None:
    source = """
if job.state == "queued":
    pass
rows = list_jobs(session, state=state)
job = Job(project_id=1, state="queued")
cycle = Cycle(project_id=1, state="planned")
update(Job).values(**guard.assign, leased_at=now)
"""
    assert state_writes(source) == []
