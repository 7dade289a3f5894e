"""The runner on a throw-away project: a raising variant, and an inaccurate fast variant."""

import json

import pytest
import torch
from autopilot_harness import Case, Experiment, Variant
from autopilot_harness.experiment import run
from autopilot_harness.protocol import EventStream

from tests.integration.harness.harness_projects import validate

CONFIG = """
[project]
name = "scratch"
[experiments.scratch]
entry = "scratch.bench"
metric = "ratio"
direction = "lower"
[experiments.scratch.tolerance]
rtol = 1e-4
atol = 1e-6
[experiments.scratch.parameters]
n = [64, 128]
[experiments.scratch.defaults]
n = 64
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "autopilot.toml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    for key in ("AUTOPILOT_SPEC", "AUTOPILOT_RESULT", "AUTOPILOT_EVENTS"):
        monkeypatch.delenv(key, raising=False)
    (tmp_path / "spec.json").write_text(
        json.dumps({"experiment": "scratch", "repeats": 5, "options": {"thread_sweep": False}})
    )
    return tmp_path


def _run(build):
    code, result, path = run(
        {"scratch": Experiment(build=build)},
        ["--spec", "spec.json", "--result", "out.json"],
        events=EventStream(None),
    )
    assert json.loads(path.read_text()) == result
    validate(result)
    return code, result


def test_a_variant_that_raises_is_an_error_result(project):
    x = torch.randn(64, 64)

    def broken():
        raise RuntimeError("kernel exploded")

    code, result = _run(lambda ctx: Case(Variant("a", lambda: x @ x), [Variant("b", broken)]))
    assert code == 1
    assert result["status"] == "error"
    assert "'b'" in result["error"]["message"]
    assert "kernel exploded" in result["error"]["message"]
    assert result["parameters"] == {"n": 64}
    assert "verdict" not in result


def test_a_fast_but_wrong_variant_is_rejected(project):
    x = torch.randn(64, 64)
    y = torch.zeros(64, 64)

    code, result = _run(
        lambda ctx: Case(
            Variant("slow_right", lambda: x @ x @ x @ x),
            [Variant("fast_wrong", lambda: y)],
            reference=lambda: x.double() @ x.double() @ x.double() @ x.double(),
        )
    )
    assert code == 0
    comp = result["comparisons"][0]
    assert comp["ratio"] < 1
    assert not comp["accuracy"]["pass"]
    assert comp["verdict"] == result["verdict"] == "rejected_accuracy"


def test_fresh_inputs_catch_a_stale_output_even_without_a_reference(project):
    """With `make_inputs` and no reference, the baseline's answer for each checked call's own
    inputs is the reference: a variant that returns its first output ever after fails a
    check during the timing loop."""
    first = []

    def stale(x):
        if not first:
            first.append(x @ x)
        return first[0]

    def build(ctx):
        return Case(
            Variant("a", lambda x: x @ x),
            [Variant("b", stale)],
            inputs=(torch.randn(64, 64),),
            make_inputs=lambda seed: (torch.randn(64, 64, generator=torch.manual_seed(seed)),),
        )

    code, result = _run(build)
    assert code == 0, result.get("error")
    comp = result["comparisons"][0]
    assert comp["verdict"] == "rejected_accuracy"
    assert comp["accuracy"]["at"].startswith("timed call"), comp["accuracy"]
    assert result["integrity"]["output_checks"] == {"a": 6, "b": 6}
    assert result["baseline"]["accuracy"]["pass"] is True
