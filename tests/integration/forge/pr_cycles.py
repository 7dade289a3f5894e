"""Two cycles ready to publish, for the pull request body's tests: a harness experiment's and a
command experiment's, each with the judged result its commit step wrote."""

from __future__ import annotations

from typing import Any

from app.cycles.headline import headline
from app.cycles.models import Cycle
from tests.integration.forge.gitrepo import harness_result
from tests.unit.reports.test_command import command_result

COMMIT = "c" * 40
BASE = "b" * 40
DASHBOARD = "https://autopilot.lab/dashboard"


def cycle_for(result: dict[str, Any], cycle_id: int, experiment: str) -> Cycle:
    return Cycle(
        id=cycle_id,
        project_id=1,
        state="publishing",
        agent="sweep",
        experiment=experiment,
        parameters=dict(result.get("parameters") or {"width": 32}),
        hypothesis="Fusing the two FFT passes halves the time",
        changed_hypothesis="kernel.py fuses the passes into one loop",
        proposal={"proposed_lessons": ["Fusion pays off above n=128"]},
        base_sha=BASE,
        commit_sha=COMMIT,
        verdict=str(result["verdict"]),
        headline=headline(result),
    )


def harness_cycle() -> tuple[Cycle, dict[str, Any]]:
    result = harness_result()
    result["noise_floor"] = {"floor": 0.02, "estimate": 1.0, "samples": 20}
    return cycle_for(result, 41, "matmul"), result


def command_cycle() -> tuple[Cycle, dict[str, Any]]:
    result = command_result()
    return cycle_for(result, 42, "train"), result
