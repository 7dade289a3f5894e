"""A GPU host loads what it runs: a GPU worker's process, from `autopilot worker gpu` to the task
modules Celery imports, holds no module of the control plane's domains. Checked in a fresh
interpreter; import-linter checks the same of every import these modules make, function bodies
included (pyproject.toml, "a GPU host loads what it runs")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONTROL_PLANE = ("app.cycles", "app.memory", "app.forge", "app.agents", "app.dashboard")

# What a GPU worker's process imports before its first job: the console script's path to
# `autopilot worker gpu` (its --help stops short of starting Celery), the modules that command
# imports in its body, the task modules Celery imports (`include`), and the doctor's checks the
# start checks borrow.
GPU_WORKER = """
import json, sys
sys.argv = ["autopilot", "worker", "gpu", "--help"]
from workers.cli import main
try:
    main()
except SystemExit:
    pass
import app.cli.common, app.db, app.jobs.service
import workers.gpu, workers.gpu_start, workers.gpu_host, workers.lease_gate, workers.log_outbox
import workers.launcher.execstub
from workers.celery_app import celery
celery.loader.import_default_modules()
print(json.dumps(sorted(sys.modules)))
"""

# The full command, for the same question: the check can see a control-plane module.
FULL_COMMAND = """
import json, sys
import workers.commands
print(json.dumps(sorted(sys.modules)))
"""


def loaded(tmp_path: Path, program: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOPILOT_")}
    env["AUTOPILOT_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules


def of_control_plane(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith(tuple(f"{p}." for p in CONTROL_PLANE))]


def test_a_gpu_worker_loads_no_module_of_the_control_plane(tmp_path: Path) -> None:
    modules = loaded(tmp_path, GPU_WORKER)
    assert {"workers.tasks", "workers.gpu", "workers.prepare", "workers.blocks"} <= set(modules)
    assert of_control_plane(modules) == []
    assert not set(CONTROL_PLANE) & set(modules)


def test_the_full_command_loads_the_control_plane(tmp_path: Path) -> None:
    assert "app.cycles.service" in of_control_plane(loaded(tmp_path, FULL_COMMAND))
