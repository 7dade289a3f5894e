"""What of a job's spec the experiment process sees: the protocol's keys, nothing of the worker's.

The harness refuses a spec key it does not know, so a worker-only key (`head_vs_base`) that
reached spec.json would fail every changed-code job of a harness project."""

from __future__ import annotations

from pathlib import Path

from autopilot_harness.protocol import SPEC_KEYS, load_config, parse_spec

from workers.launcher.staging import EXPERIMENT_SPEC_KEYS, experiment_spec

PROJECTS = Path(__file__).resolve().parents[3] / "experiments" / "projects"


def test_the_worker_and_the_harness_agree_on_the_protocols_keys() -> None:
    assert set(EXPERIMENT_SPEC_KEYS) == SPEC_KEYS


def test_worker_only_keys_never_reach_the_experiment() -> None:
    job_spec = {
        "experiment": "contraction",
        "parameters": {"batch": 4, "channels": 8, "modes": 16},
        "device": "cpu",
        "seed": 7,
        "tolerance": {"rtol": 1e-4, "atol": 1e-6},
        "head_vs_base": True,
        "baseline_parameters": {"batch": 8},
    }
    seen = experiment_spec(job_spec)
    assert seen == {k: v for k, v in job_spec.items() if k in SPEC_KEYS}
    assert "head_vs_base" not in seen and "baseline_parameters" not in seen
    configs = load_config(PROJECTS / "complex_contraction" / "autopilot.toml")
    assert parse_spec(seen, configs).seed == 7  # the harness takes what the worker writes
