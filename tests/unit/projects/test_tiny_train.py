"""The tiny_train example project: train.py writes the weights its hold-out evaluator reads,
trains, is deterministic, and its step time grows with the width (the lever its experiment
measures)."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[3] / "experiments" / "projects" / "tiny_train"
STEP_LINE = re.compile(r"^step (\d+) loss ([0-9.]+) time ([0-9.]+)ms$", re.MULTILINE)
PLACEHOLDER = re.compile(r"\{(\w+)\}")


@pytest.fixture(scope="module")
def experiment() -> dict[str, Any]:
    with open(PROJECT / "autopilot.toml", "rb") as handle:
        return tomllib.load(handle)["experiments"]["train"]


def output(argv: list[str]) -> tuple[str, str]:
    """stdout and stderr of one run of train.py (argv after the interpreter)."""
    done = subprocess.run(
        [sys.executable, *argv],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, done.stderr


def train(*args: str) -> str:
    return output(["train.py", *args])[0]


def matches(pattern: str, *texts: str) -> list[float]:
    """Every `value` the pattern finds, stdout then stderr, as the runner reads them."""
    return [float(m.group("value")) for text in texts for m in re.finditer(pattern, text)]


def test_the_configured_command_writes_what_the_evaluator_reads(experiment, tmp_path):
    assert experiment["kind"] == "command" and experiment["metric_source"] == "wall"
    defaults, parameters = experiment["defaults"], experiment["parameters"]
    for name, value in defaults.items():
        assert value in parameters[name], name
    values = {**defaults, "device": "cuda:0"}
    argv = [
        PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), arg) for arg in experiment["command"]
    ]
    assert argv[0] == "python"
    [artifact] = experiment["artifacts"]
    argv = [a.replace(artifact, str(tmp_path / artifact)) for a in argv]

    stdout, stderr = output(argv[1:])

    steps = STEP_LINE.findall(stdout)
    assert [int(step) for step, _, _ in steps] == list(range(10, 201, 10))  # --log-every=10
    assert "trains on the CPU" in stderr
    evaluator = [a.replace("{artifact}", str(tmp_path / artifact)) for a in experiment["evaluator"]]
    stdout, _ = output(evaluator[1:])
    [loss] = matches(experiment["evaluator_check_pattern"], stdout)
    assert 0 < loss < 0.2


def test_the_evaluator_recomputes_the_loss_from_the_weights_alone(experiment, tmp_path):
    """A model file that claims a low loss is judged by its weights: the claim is ignored."""
    forged = tmp_path / "model.json"
    forged.write_text('{"w1": [1.0], "b1": [0.0], "w2": [0.0], "b2": 0.0, "loss": 1e-9}')
    stdout, _ = output(["holdout/evaluate.py", f"--model={forged}"])
    [loss] = matches(experiment["evaluator_check_pattern"], stdout)
    assert loss > 0.3  # a constant 0 against sin(3x): far from the trained model's ~0.04


def test_the_hold_out_data_is_hidden_from_the_runs():
    with open(PROJECT / "autopilot.toml", "rb") as handle:
        project = tomllib.load(handle)["project"]
    assert project["hidden_paths"] == ["holdout"]
    assert "holdout" not in (PROJECT / "train.py").read_text()


def test_the_loss_goes_down():
    stdout = train("--seed", "1")
    losses = [float(loss) for _, loss, _ in STEP_LINE.findall(stdout)]
    [val_loss] = matches(r"val loss (?P<value>[0-9.]+)", stdout)
    assert losses[-1] < 0.6 * losses[0]
    assert val_loss < losses[0]


def test_the_same_seed_gives_the_same_losses():
    def losses(seed: str) -> list[str]:
        stdout = train("--seed", seed, "--steps", "60", "--log-every", "20")
        return [re.sub(r" time [0-9.]+ms", "", line) for line in stdout.splitlines()]

    first = losses("5")
    assert len(first) == 4
    assert losses("5") == first
    assert losses("6") != first


def test_a_wider_layer_takes_longer_per_step(experiment):
    def step_ms(width: int) -> float:
        stdout = train("--width", str(width), "--steps", "100", "--log-every", "25")
        return statistics.median(matches(r"time (?P<value>[0-9.]+)ms", stdout))

    narrow: list[float] = []
    wide: list[float] = []
    for _ in range(5):  # interleaved, so that a slow spell of the machine falls on both
        narrow.append(step_ms(16))
        wide.append(step_ms(64))
    assert statistics.median(wide) > 1.5 * statistics.median(narrow), (narrow, wide)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", ""])
def test_a_device_it_cannot_name_is_refused(device):
    done = subprocess.run(
        [sys.executable, "train.py", f"--device={device}"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "is not a device" in done.stderr
