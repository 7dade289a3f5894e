"""Running example projects as real subprocesses, the way the GPU worker does."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema

ROOT = Path(__file__).resolve().parents[3]
HARNESS = ROOT / "experiments" / "harness"
PROJECTS = ROOT / "experiments" / "projects"
SCHEMA = json.loads((HARNESS / "result.schema.json").read_text())
ENTRIES = {"complex_contraction": "contraction.bench", "lora_fusion": "lora.bench"}
TINY = {
    "complex_contraction": {"batch": 4, "channels": 8, "modes": 16},
    "lora_fusion": {"tokens": 32, "hidden": 32, "rank": 4, "adapters": 2, "sweep_max_tokens": 128},
}


def validate(result):
    jsonschema.validate(
        result,
        SCHEMA,
        cls=jsonschema.Draft202012Validator,
        format_checker=jsonschema.FormatChecker(),
    )


def project_env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HARNESS), env.get("PYTHONPATH")]))
    for key in ("AUTOPILOT_SPEC", "AUTOPILOT_RESULT", "AUTOPILOT_EVENTS"):
        env.pop(key, None)
    env.update(extra)
    return env


def run_project(project, *args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", ENTRIES[project], *args],
        cwd=PROJECTS / project,
        env=env or project_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def write_spec(path, project, experiment, repeats=5, **overrides):
    spec = {
        "experiment": experiment,
        "parameters": dict(TINY[project]),
        "device": "cpu",
        "seed": 1,
        "repeats": repeats,
        "options": {"thread_sweep": False},
    }
    spec.update(overrides)
    path.write_text(json.dumps(spec))
    return path
