"""The example projects, run for real as the GPU worker runs them, are judged exactly as they
reported themselves: the control plane's statistics are the harness's, with the same seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cycles.judge import judge
from app.projects import config as project_config
from tests.integration.harness.harness_projects import PROJECTS, run_project, write_spec

EXPERIMENT = {"complex_contraction": "contraction", "lora_fusion": "lora"}


@pytest.mark.parametrize("project", ["complex_contraction", "lora_fusion"])
def test_an_honest_example_result_is_judged_as_reported(project: str, tmp_path: Path) -> None:
    spec_path = write_spec(tmp_path / "spec.json", project, EXPERIMENT[project], seed=3)
    out = tmp_path / "result.json"
    done = run_project(project, "--spec", str(spec_path), "--result", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    declared = project_config.load(PROJECTS / project).experiment(EXPERIMENT[project])
    # What jobs.submit writes into Job.spec: the seed and the declared tolerance.
    spec = {**json.loads(spec_path.read_text()), "tolerance": declared.tolerance.model_dump()}

    judged = judge(result, spec)

    assert judged["judgement"]["disagreements"] == []
    assert judged["verdict"] == result["verdict"]
    for mine, theirs in zip(judged["comparisons"], result["comparisons"], strict=True):
        assert {k: mine[k] for k in ("ratio", "ci_low", "ci_high", "verdict")} == {
            k: theirs[k] for k in ("ratio", "ci_low", "ci_high", "verdict")
        }
        assert mine["accuracy"]["pass"] == theirs["accuracy"]["pass"]
    assert judged["noise_floor"]["floor"] == result["noise_floor"]["floor"]
    expected = [k for k in ("factorial", "study") if result.get(k) is not None]
    assert judged["judgement"]["not_judged"] == expected
