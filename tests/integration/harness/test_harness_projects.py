"""Both example projects run end to end from the command line and give schema-valid results."""

import json

import pytest

from tests.integration.harness.harness_projects import (
    PROJECTS,
    project_env,
    run_project,
    validate,
    write_spec,
)

EXPERIMENT = {"complex_contraction": "contraction", "lora_fusion": "lora"}


@pytest.mark.parametrize("project", ["complex_contraction", "lora_fusion"])
def test_project_runs_from_spec_and_result_validates(project, tmp_path):
    spec = write_spec(tmp_path / "spec.json", project, EXPERIMENT[project])
    out = tmp_path / "result.json"
    done = run_project(project, "--spec", str(spec), "--result", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    validate(result)
    assert result["status"] == "ok"
    assert result["experiment"] == EXPERIMENT[project]
    assert result["repeats"] == 5
    for comp in result["comparisons"]:
        assert comp["accuracy"]["pass"], comp["accuracy"]
        assert comp["verdict"] in {"faster", "slower", "inconclusive"}
        assert len(comp["samples"]["a_ns"]) == 5
    assert result["ratio"] == result["comparisons"][0]["ratio"]
    assert result["environment"]["torch"]
    assert result["thread_sweep"] is None
    if project == "complex_contraction":
        study = result["study"]
        assert study["R"] == pytest.approx(study["t_complex_ns"] / study["t_real_ns"])
        assert study["gauss_can_win"] == (study["R"] > 3)
    else:
        labels = {row["label"] for row in result["factorial"]["combinations"]}
        assert labels == {"fuse", "reassociate", "fuse+reassociate"}
        sweep = result["study"]["batch_sweep"]
        assert [p["tokens"] for p in sweep] == [2, 4, 8, 16, 32, 64, 128]
        assert result["study"]["knee_tokens"] in {p["tokens"] for p in sweep}


@pytest.mark.parametrize("project", ["complex_contraction", "lora_fusion"])
def test_project_runs_its_cpu_defaults_without_a_spec(project, tmp_path):
    out = tmp_path / "result.json"
    done = run_project(project, env=project_env(AUTOPILOT_RESULT=str(out)))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    validate(result)
    assert result["status"] == "ok"
    assert result["thread_sweep"]["threads"][0] == 1
    assert not (PROJECTS / project / "result.json").exists()


@pytest.mark.parametrize(
    ("project", "overrides", "message"),
    [
        ("complex_contraction", {"surprise": 1}, "surprise"),
        ("complex_contraction", {"parameters": {"batch": "8"}}, "batch"),
        ("complex_contraction", {"tolerance": {"rtol": 0, "atol": 1e-6}}, "rtol"),
        (
            "complex_contraction",
            {"parameters": {"batch": 128, "channels": 128, "modes": 10**9}},
            "GiB",
        ),
        (
            "lora_fusion",
            {
                "parameters": {
                    "tokens": 33,
                    "hidden": 32,
                    "rank": 4,
                    "adapters": 2,
                    "sweep_max_tokens": 128,
                }
            },
            "multiple of adapters",
        ),
    ],
)
def test_bad_input_gives_an_error_result_never_a_partial_one(project, overrides, message, tmp_path):
    spec = write_spec(tmp_path / "spec.json", project, EXPERIMENT[project], **overrides)
    out = tmp_path / "result.json"
    done = run_project(project, "--spec", str(spec), "--result", str(out))
    assert done.returncode == 1
    result = json.loads(out.read_text())
    validate(result)
    assert result["status"] == "error"
    assert message in result["error"]["message"]
    assert result["experiment"] == EXPERIMENT[project]
    assert "ratio" not in result
    assert "comparisons" not in result


def test_unreadable_spec_is_an_error_result(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text("{not json")
    out = tmp_path / "result.json"
    done = run_project("complex_contraction", "--spec", str(spec), "--result", str(out))
    assert done.returncode == 1
    result = json.loads(out.read_text())
    validate(result)
    assert "not valid JSON" in result["error"]["message"]
