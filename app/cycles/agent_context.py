"""What an agent is shown before it proposes (memory in the loop for every agent): the
project's config, the validated and refuted findings, its last cycles with their verdicts and
ratios, the points reviewers have judged, and whether a point is already covered (judged in
memory, or held by a live cycle). Built the same way for a cycle's plan step and for
`autopilot agent try`."""

from __future__ import annotations

from typing import Any

from app.agents.service import Context
from app.cycles import repository
from app.db import Stores
from app.memory import agents as memory_agents
from app.memory import service as memory
from app.projects.config import ProjectConfig
from app.projects.models import Project

RECENT_CYCLES = 10


def build_context(
    stores: Stores, project: Project, config: ProjectConfig, exclude_cycle: int = 0
) -> Context:
    """The agent's context for `project` at its base `config`; `exclude_cycle` is the cycle
    being planned (its own fingerprint covers nothing)."""
    name, gpu_kind = project.name, project.gpu_kind
    with stores.ops_session() as session:
        live = repository.live_fingerprints(session, project.id, exclude=exclude_cycle)
        rows = repository.list_cycles(session, project_id=project.id, limit=RECENT_CYCLES + 1)
        recent = [_cycle(c) for c in rows if c.id != exclude_cycle][:RECENT_CYCLES]
    with stores.memory_session() as msession:
        related = memory_agents.agent_findings(msession, name, config.agent.goal or name)
        judged = memory_agents.judged_points(msession, name)
        # Read at once: the sweep walks past every covered point before its proposal, and a
        # query for each judged one made a plan's reads grow with the project's history.
        repeats = memory_agents.judged_fingerprints(msession, name)

    def fingerprint(experiment: str, parameters: dict[str, Any]) -> str:
        return memory.fingerprint(name, experiment, parameters, gpu_kind)

    known = live | repeats

    def covered(experiment: str, parameters: dict[str, Any]) -> bool:
        fp = fingerprint(experiment, parameters)
        if fp in known:
            return True
        with stores.memory_session() as msession:
            return memory.check_repeat(msession, fp) is not None

    return Context(
        name,
        gpu_kind,
        config,
        related,
        recent,
        judged,
        is_covered=covered,
        covered=known,
        fingerprint=fingerprint,
        cycle_id=exclude_cycle or None,
    )


def _cycle(c: Any) -> dict[str, Any]:
    headline = c.headline or {}
    return {
        "id": c.id,
        "state": c.state,
        "experiment": c.experiment,
        "parameters": c.parameters,
        "hypothesis": c.hypothesis,
        "verdict": c.verdict,
        **{k: headline.get(k) for k in ("ratio", "ci_low", "ci_high")},
    }
