"""Spec validation against a project's declared parameter space, events and result file."""

import json
from pathlib import Path

import pytest
from autopilot_harness import protocol
from autopilot_harness.protocol import SpecError

PROJECTS = Path(__file__).resolve().parents[3] / "experiments" / "projects"

CONFIG = """
[project]
name = "demo"
gpu_kind = "cpu"
[experiments.demo]
entry = "demo.bench"
metric = "ratio"
direction = "lower"
time_limit_s = 60
[experiments.demo.tolerance]
rtol = 1e-4
atol = 1e-6
[experiments.demo.parameters]
batch = [8, 32]
scale = [0.5, 1.0]
dtype = ["float32", "bfloat16"]
fused = [true, false]
[experiments.demo.defaults]
batch = 8
scale = 1.0
dtype = "float32"
fused = false
"""


@pytest.fixture
def configs(tmp_path):
    path = tmp_path / "autopilot.toml"
    path.write_text(CONFIG)
    return protocol.load_config(path)


def test_defaults_fill_a_minimal_spec(configs):
    spec = protocol.parse_spec({"experiment": "demo"}, configs)
    assert spec.parameters == {"batch": 8, "scale": 1.0, "dtype": "float32", "fused": False}
    assert spec.device == "cpu"
    assert spec.seed == 0
    assert spec.tolerance == protocol.Tolerance(1e-4, 1e-6)


def test_spec_overrides_and_int_is_accepted_for_float(configs):
    spec = protocol.parse_spec(
        {
            "experiment": "demo",
            "parameters": {"batch": 32, "scale": 2},
            "device": "cuda",
            "seed": 5,
            "repeats": 10,
            "tolerance": {"rtol": 1e-3, "atol": 1e-5},
            "options": {"cuda_graph": True},
        },
        configs,
    )
    assert spec.parameters["batch"] == 32
    assert spec.parameters["scale"] == 2
    assert spec.repeats == 10
    assert spec.tolerance.rtol == 1e-3
    assert spec.options == {"cuda_graph": True}


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ({"experiment": "demo", "bogus": 1}, "bogus"),
        ({"experiment": "demo", "parameters": {"batchsize": 8}}, "batchsize"),
        ({"experiment": "demo", "parameters": {"batch": "8"}}, "batch"),
        ({"experiment": "demo", "parameters": {"batch": 8.0}}, "batch"),
        ({"experiment": "demo", "parameters": {"batch": True}}, "batch"),
        ({"experiment": "demo", "parameters": {"fused": 1}}, "fused"),
        ({"experiment": "demo", "parameters": {"dtype": 16}}, "dtype"),
        ({"experiment": "demo", "parameters": []}, "parameters"),
        ({"experiment": "demo", "seed": "1"}, "seed"),
        ({"experiment": "demo", "seed": -1}, "seed"),
        ({"experiment": "demo", "repeats": 1}, "repeats"),
        ({"experiment": "demo", "repeats": 2.5}, "repeats"),
        ({"experiment": "demo", "device": "tpu"}, "device"),
        ({"experiment": "demo", "tolerance": {"rtol": 0, "atol": 1e-6}}, "rtol"),
        ({"experiment": "demo", "tolerance": {"rtol": 1e-4, "atol": -1}}, "atol"),
        ({"experiment": "demo", "tolerance": {"rtol": 1e-4}}, "atol"),
        ({"experiment": "demo", "tolerance": {"rtol": "1e-4", "atol": 1e-6}}, "rtol"),
        ({"experiment": "demo", "tolerance": {"rtol": 1e-4, "atol": 1e-6, "x": 1}}, "x"),
        ({"experiment": "demo", "options": {"graphs": True}}, "graphs"),
        ({"experiment": "demo", "options": {"backward": "yes"}}, "backward"),
        ({"experiment": "other"}, "other"),
        ({"experiment": 3}, "experiment"),
        ({}, "experiment"),
        ([], "object"),
    ],
)
def test_bad_specs_name_what_is_wrong(configs, spec, named):
    with pytest.raises(SpecError, match=named):
        protocol.parse_spec(spec, configs)


def test_config_with_undeclared_default_is_rejected(tmp_path):
    path = tmp_path / "autopilot.toml"
    path.write_text(CONFIG.replace('fused = false\n"""', "") + "\nwidth = 3\n")
    with pytest.raises(SpecError, match="width"):
        protocol.load_config(path)


@pytest.mark.parametrize("project", ["complex_contraction", "lora_fusion"])
def test_example_project_configs_parse_and_defaults_are_declared_values(project):
    configs = protocol.load_config(PROJECTS / project / "autopilot.toml")
    for config in configs.values():
        assert config.direction == "lower"
        for key, value in config.defaults.items():
            assert value in config.parameters[key]
        spec = protocol.parse_spec({"experiment": config.name}, configs)
        assert set(spec.parameters) == set(config.parameters)


def test_find_config_walks_up(tmp_path):
    (tmp_path / "autopilot.toml").write_text(CONFIG)
    nested = tmp_path / "pkg" / "sub"
    nested.mkdir(parents=True)
    assert protocol.find_config(nested) == tmp_path / "autopilot.toml"


def test_events_without_a_runner_are_silent(tmp_path):
    for path in (None, "", str(tmp_path / "nobody-listens.sock")):
        stream = protocol.EventStream(path)
        assert not stream.connected
        stream.send({"type": "log", "message": "dropped"})
        stream.close()


def test_result_is_written_whole(tmp_path):
    target = tmp_path / "out" / "result.json"
    protocol.write_result(target, {"status": "ok", "ratio": 0.9})
    assert json.loads(target.read_text()) == {"status": "ok", "ratio": 0.9}
    assert [p.name for p in target.parent.iterdir()] == ["result.json"]


def test_result_with_nan_is_refused_and_leaves_nothing(tmp_path):
    target = tmp_path / "result.json"
    with pytest.raises(ValueError, match="JSON"):
        protocol.write_result(target, {"ratio": float("nan")})
    assert list(tmp_path.iterdir()) == []
