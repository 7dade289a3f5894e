"""A sweep's plan against the project's history (a control plane that keeps its pace as cycles
pile up).

What runs under the project's lock in a sweep's plan step (`steps/plan.py`): the agent's context
(`cycles/agent_context.build_context`: the fingerprints live cycles hold, the points reviewers
judged, the last cycles) and the sweep's proposal (`SweepAgent.propose`: the first point of the
space that nothing covers). Measured on two projects of one store with the same 20,000-point
space (`bench/fleet.py`'s): one whose first `--history` points are held by earlier cycles
awaiting review (what a fleet leaves behind while reviewers catch up: 300 cycles a minute is
18,000 an hour), and the baseline, a project with none. The two are measured alternately, a plan
each, `--plans` times; the figure is the ratio of the medians.

    python bench/plan_history.py [--quick] [--json] [--history 15000] [--plans 30]
                                 [--ops-url URL --memory-url URL]

Without `--ops-url` both stores are SQLite files in a temporary directory.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import bench_parser, emit, machine, probe_config, today
from sqlalchemy import insert

from app import migrate
from app.agents import grid
from app.agents import service as agents
from app.cycles.agent_context import build_context
from app.cycles.models import Cycle
from app.db import Stores
from app.memory import service as memory
from app.projects import config as project_config
from app.projects import service as ops
from app.projects.schemas import ProjectCreate
from app.settings import Settings

K_POINTS, J_POINTS, SLEEP_S = 200, 100, 2.5  # bench/fleet.py's space


def config_of(name: str) -> project_config.ProjectConfig:
    return project_config.parse(
        probe_config(
            name,
            "probe",
            "probe.main",
            120,
            parameters={
                "k": list(range(K_POINTS)),
                "j": list(range(J_POINTS)),
                "sleep_s": [SLEEP_S],
            },
            defaults={"k": 0, "j": 0, "sleep_s": SLEEP_S},
        )
    )


def held_history(stores: Stores, project_id: int, name: str, count: int) -> None:
    """`count` cycles awaiting review, holding the space's first `count` points in the sweep's
    order (as a sweep proposed them)."""
    experiment = config_of(name).experiment("probe")
    rows: list[dict[str, Any]] = []
    for params in itertools.islice(grid.filled(experiment.parameters, experiment.defaults), count):
        rows.append(
            {
                "project_id": project_id,
                "state": "awaiting_review",
                "agent": "sweep",
                "experiment": "probe",
                "parameters": params,
                "fingerprint": memory.fingerprint(name, "probe", params, "cpu"),
            }
        )
    with stores.ops_session() as session:
        for start in range(0, len(rows), 5000):
            session.execute(insert(Cycle), rows[start : start + 5000])


def plan_once(stores: Stores, name: str) -> tuple[float, dict[str, Any]]:
    """One plan's agent part: seconds of wall time, and the point it proposed."""
    with stores.ops_session() as session:
        project = ops.get_project(session, name)
        session.expunge(project)
    config = config_of(name)
    started = time.perf_counter()
    context = build_context(stores, project, config)
    proposal = agents.SweepAgent().propose(context)
    elapsed = time.perf_counter() - started
    assert proposal is not None
    return elapsed, proposal.parameters


def main() -> None:
    parser = bench_parser(__doc__, quick="2,000 cycles of history and 10 plans")
    parser.add_argument("--history", type=int, default=15000)
    parser.add_argument("--plans", type=int, default=30)
    parser.add_argument("--ops-url")
    parser.add_argument("--memory-url")
    args = parser.parse_args()
    history, plans = (2000, 10) if args.quick else (args.history, args.plans)
    with tempfile.TemporaryDirectory(prefix="plan-history-") as tmp:
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            state_dir=Path(tmp) / "state",
            ops_url=args.ops_url or f"sqlite:///{tmp}/ops.db",
            memory_url=args.memory_url or f"sqlite:///{tmp}/memory.db",
        )
        migrate.upgrade(settings)
        stores = Stores.from_settings(settings)
        try:
            result = measure(stores, Path(tmp), history, plans)
        finally:
            stores.dispose()
    result.update(
        {
            "store": "postgresql" if args.ops_url else "sqlite",
            "quick": bool(args.quick),
            "machine": machine("cpu", "cores", "python"),
            "date": today(),
        }
    )
    emit(result, args.json)


def measure(stores: Stores, tmp: Path, history: int, plans: int) -> dict[str, Any]:
    names = {"history": "swept", "baseline": "fresh"}
    for name in names.values():
        with stores.ops_session() as session:
            project = ops.create_project(session, ProjectCreate(name=name, repo_url=str(tmp)))
            project_id = project.id
        if name == names["history"]:
            held_history(stores, project_id, name, history)
    times: dict[str, list[float]] = {role: [] for role in names}
    proposed: dict[str, dict[str, Any]] = {}
    for name in names.values():  # warm-up: imports, the statement cache
        plan_once(stores, name)
    for _ in range(plans):
        for role, name in names.items():
            elapsed, proposed[role] = plan_once(stores, name)
            times[role].append(elapsed)
    expected = {"k": history // J_POINTS, "j": history % J_POINTS, "sleep_s": SLEEP_S}
    if proposed["history"] != expected:
        sys.exit(f"the sweep proposed {proposed['history']}, not the first free point {expected}")
    median = {role: statistics.median(values) * 1000 for role, values in times.items()}
    return {
        "bench": "plan_history",
        "history": history,
        "plans": plans,
        "plan_ms_median": round(median["history"], 2),
        "baseline": {
            "what": "the same plan in a project with no history",
            "plan_ms_median": round(median["baseline"], 2),
        },
        "ratio": round(median["history"] / median["baseline"], 2),
        "plan_ms_p90": round(sorted(times["history"])[int(0.9 * (plans - 1))] * 1000, 2),
    }


if __name__ == "__main__":
    main()
