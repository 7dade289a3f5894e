"""Every state change of every table goes through its lifecycle: each table with a state column
has one (a table of the one primitive, app/statemachine.py), and no module of app/ or workers/
but a `lifecycle.py` assigns a state attribute, or writes one in an UPDATE's values."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

import app.tables  # noqa: F401  (every model registered)
from app.cycles import lifecycle as cycles
from app.cycles.campaigns import lifecycle as campaigns
from app.db import OpsBase
from app.forge import lifecycle as forge
from app.jobs import lifecycle as jobs
from app.memory import lifecycle as memory
from app.memory.models import MemoryBase
from app.statemachine import IllegalMove, Lifecycle

ROOT = Path(__file__).resolve().parents[3]

#: Each table with a state, and the lifecycle that owns its moves.
LIFECYCLES: dict[str, Lifecycle] = {
    "job": jobs.JOB,
    "job_preparation": jobs.PREPARATION,
    "cycle": cycles.CYCLE,
    "cycle_step": cycles.ATTEMPT,
    "campaign": campaigns.CAMPAIGN,
    "campaign_step": campaigns.STEP,
    "finding": memory.FINDING,
    "pull_request": forge.PULL_REQUEST,
}
#: The attributes a lifecycle moves: a write of one of these elsewhere is a state change.
STATE_ATTRS = frozenset({"state", "status"} | {life.attr for life in LIFECYCLES.values()})
#: The declarative bases of the tables: a class on one of them is a row.
MODEL_BASES = frozenset({"OpsBase", "MemoryBase"})


def _targets(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.Tuple | ast.List):
        return [leaf for item in node.elts for leaf in _targets(item)]
    if isinstance(node, ast.Starred):
        return _targets(node.value)
    return [node]


def _names_state(node: ast.expr, attrs: frozenset[str]) -> bool:
    return isinstance(node, ast.Constant) and node.value in attrs


def _own_attributes(tree: ast.AST) -> set[int]:
    """The `self.<name>` nodes in a class that is no table's model: that object's own attribute
    (an HTTP error's status code, a worker's in-process state), no row's."""
    own: set[int] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        if any(ast.unparse(base).rpartition(".")[2] in MODEL_BASES for base in cls.bases):
            continue
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                own.add(id(node))
    return own


def state_writes(source: str, attrs: frozenset[str] = STATE_ATTRS) -> list[tuple[int, str]]:
    """(line, what) of each write of a state attribute (`attrs`): an assignment to such an
    attribute (tuple targets and augmented ones too), `setattr(x, "state", ...)`, and
    `.values(state=...)` or `.values({"state": ...})`. A constructor's `state=` (a new row in
    its first state) is no move, nor an object's write of its own attribute (`self.status`)
    where it is no table's model."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    own = _own_attributes(tree)
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = [leaf for target in node.targets for leaf in _targets(target)]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = _targets(node.target)
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in attrs and id(target) not in own:
                found.append((node.lineno, ast.unparse(target)))
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id == "setattr"
            and len(node.args) >= 2
            and _names_state(node.args[1], attrs)
        ):
            found.append((node.lineno, f"setattr({ast.unparse(node.args[0])}, ...)"))
        if isinstance(func, ast.Attribute) and func.attr == "values":
            named = any(k.arg in attrs for k in node.keywords)
            keyed = any(
                isinstance(arg, ast.Dict) and any(_names_state(k, attrs) for k in arg.keys if k)
                for arg in [*node.args, *(k.value for k in node.keywords if k.arg is None)]
            )
            if named or keyed:
                found.append((node.lineno, "values(state=...)"))
    return sorted(found)


def _sources() -> list[tuple[str, str]]:
    return [
        (str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"))
        for package in ("app", "workers")
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_only_the_lifecycles_change_a_state() -> None:
    offenders = []
    for name, source in _sources():
        if Path(name).name == "lifecycle.py":
            continue
        offenders += [f"{name}:{line}: {what}" for line, what in state_writes(source)]
    assert offenders == [], "move it through its domain's lifecycle.py (app/statemachine.py)"


def test_every_table_with_a_state_has_a_lifecycle() -> None:
    with_state = {
        table.name
        for base in (OpsBase, MemoryBase)
        for table in base.metadata.tables.values()
        if any(column.name in STATE_ATTRS for column in table.columns)
    }
    assert with_state == set(LIFECYCLES)


@pytest.mark.parametrize("table", sorted(LIFECYCLES))
def test_each_lifecycle_fits_its_table(table: str) -> None:
    """Its column exists, a new row starts in one of its states, and every state is reached
    from the first or is the first; each move says who makes it and why."""
    life = LIFECYCLES[table]
    tables = {**OpsBase.metadata.tables, **MemoryBase.metadata.tables}
    default = getattr(tables[table].columns[life.attr].default, "arg", None)
    first = life.blank if default is None else default
    assert first in life.states, (table, first)
    reached, frontier = {first}, [first]
    while frontier:
        here = frontier.pop()
        for to in life.onward(here):
            if to not in reached:
                reached.add(to)
                frontier.append(to)
    assert reached == set(life.states), (table, set(life.states) - reached)
    assert all(move.by and move.why for move in life.moves)
    assert not [pair for pair in life.allowed if pair[0] in life.final]


@pytest.mark.parametrize("table", sorted(LIFECYCLES))
def test_each_lifecycle_refuses_what_its_table_does_not_hold(table: str) -> None:
    """Every move not in the table is refused: one exception type, naming the row, its kind and
    both states; the row keeps its state. A final state is left by nothing."""
    life = LIFECYCLES[table]
    refused_moves = 0
    for frm in life.states:
        for to in set(life.states) - set(life.onward(frm)):
            row = SimpleNamespace(id=9, **{life.attr: None if frm == life.blank else frm})
            with pytest.raises(IllegalMove) as refused:
                life.move(row, to)
            assert f"{life.kind} 9 cannot move from {frm} to {to}" in refused.value.detail
            assert refused.value.extra == {"from_state": frm, "to_state": to}
            assert life.state_of(row) == frm
            refused_moves += 1
    assert refused_moves > 0
    assert all(life.onward(end) == () for end in life.final)


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
finding.status = "validated"
step.outcome = "kept"
update(CycleStep).values(status="started")
class Job(OpsBase):
    def fail(self):
        self.state = "failed"
class Worker:
    def fail(self, job):
        self.job.state = "failed"
"""
    lines = [line for line, _ in state_writes(source)]
    assert lines == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 18]


def test_the_finder_leaves_reads_filters_and_constructors_alone() -> None:
    source = """
if job.state == "queued":
    pass
rows = list_jobs(session, state=state)
job = Job(project_id=1, state="queued")
cycle = Cycle(project_id=1, state="planned")
update(Job).values(**guard.assign, leased_at=now)
app.state.stores = stores
class RequestFailed(Exception):
    def __init__(self, status):
        self.status = status
"""
    assert state_writes(source) == []
