"""The agent's context covers the points reviewers judged with one read of memory, however many
the sweep walks past (its reads do not grow with the project's history)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.agents import service as agents
from app.cycles.agent_context import build_context
from app.db import Stores
from app.memory import service as memory
from app.memory.schemas import FindingCreate
from app.projects import config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate

TOML = """
[project]
name = "grid"
[experiments.e]
entry = "pkg.bench"
[experiments.e.parameters]
n = [1, 2, 3, 4, 5, 6, 7, 8]
"""


def test_judged_points_are_covered_with_one_read_of_memory(
    stores: Stores, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with stores.ops_session() as session:
        project = ops.create_project(session, ProjectCreate(name="grid", repo_url=str(tmp_path)))
    with stores.memory_session() as msession:
        for n in (1, 2, 3, 4, 5):  # judged by reviewers: 4 validated, 1 refuted
            finding = memory.create(
                msession,
                FindingCreate(
                    project="grid",
                    kind="verdict",
                    statement=f"e at n={n}: faster",
                    fingerprint=memory.fingerprint("grid", "e", {"n": n}, "cpu"),
                ),
                actor="test",
            )
            if n == 3:
                memory.refute(msession, finding.id, actor="test", reason="a noisy host")
            else:
                memory.validate(msession, finding.id, actor="test")
    asked: list[str] = []
    check_repeat = memory.check_repeat

    def counted(session, fingerprint):  # type: ignore[no-untyped-def]
        asked.append(fingerprint)
        return check_repeat(session, fingerprint)

    monkeypatch.setattr(memory, "check_repeat", counted)
    with stores.ops_session() as session:
        project = ops.get_project(session, "grid")
        session.expunge(project)
    context = build_context(stores, project, config.parse(TOML))
    proposal = agents.SweepAgent().propose(context)
    assert proposal is not None and proposal.parameters == {"n": 6}
    # Five judged points walked past from the one read; only the proposal's own point asked.
    assert asked == [memory.fingerprint("grid", "e", {"n": 6}, "cpu")]
    assert context.is_covered("e", {"n": 3}) and not context.is_covered("e", {"n": 7})
