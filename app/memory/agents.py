"""What agents are shown of research memory (memory in the loop for every agent): the
findings for the prompt and context JSON, and the judged points of the parameter spaces."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.memory import repository
from app.memory.service import related


def agent_findings(session: Session, project: str, text: str, k: int = 8) -> list[dict[str, Any]]:
    """What every agent is shown of memory: the validated findings most related to `text` and
    the project's refuted ones, as {id, kind, status, statement}."""
    rows = [*related(session, project, text, k=k), *repository.refuted(session, project, k)]
    return [
        {"id": f.id, "kind": f.kind, "status": f.status, "statement": f.statement} for f in rows
    ]


def judged_fingerprints(session: Session, project: str) -> set[str]:
    """The fingerprints of the points of the project that reviewers have judged: a repeat of
    any of them is covered (`service.check_repeat` says so for each one, a query apiece)."""
    return repository.judged_fingerprints(session, project)


def judged_points(session: Session, project: str, limit: int = 500) -> list[dict[str, Any]]:
    """The points of the project's parameter spaces that reviewers have judged: {finding,
    status, experiment, parameters, verdict, ratio}, newest first (the informed sweep and the
    agents' context read them)."""
    out = []
    for f in repository.judged_verdicts(session, project, limit):
        tags = [t for t in (f.tags or []) if t != "autopilot"]
        metrics = f.metrics or {}
        out.append(
            {
                "finding": f.id,
                "status": f.status,
                "experiment": tags[0] if tags else None,
                "parameters": dict((f.scope or {}).get("parameters") or {}),
                "verdict": metrics.get("verdict"),
                "ratio": metrics.get("ratio"),
            }
        )
    return out
