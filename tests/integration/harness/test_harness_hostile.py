"""A hostile candidate against the shipped complex_contraction project: each attack on the
measurement ends in no `faster` win, with the reason in the result, and an honest change is
still measured. The entry runs as a GPU worker runs it: the launcher's cold start of the project
venv's interpreter on the job's tree (docs/experiments.md, "What the harness defends against")."""

from __future__ import annotations

import copy
import json
import os
import shutil
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cycles.exceptions import Unjudgeable
from app.cycles.judge import judge
from tests.integration.harness.harness_projects import HARNESS, PROJECTS, TINY
from workers.launcher.launch import LaunchSpec
from workers.launcher.runner import Limits, run_job
from workers.launcher.runtime import RuntimeDir, allocate_runtime, release_runtime
from workers.launcher.venv import Venv, ensure_venv

SPEC = {
    "experiment": "contraction",
    "parameters": TINY["complex_contraction"],
    "device": "cpu",
    "seed": 11,
    "repeats": 8,
    "tolerance": {"rtol": 1e-4, "atol": 1e-6},
    "options": {"thread_sweep": False},
}

#: The shipped kernels' Gauss form, for the attacks to wrap.
GAUSS = """
import torch
from contraction.reference import EQUATION


def native(x, w):
    return torch.einsum(EQUATION, x, w)


def real_gauss(x, w):
    a, b = x.real, x.imag
    c, d = w.real, w.imag
    k1 = torch.einsum(EQUATION, a + b, c)
    k2 = torch.einsum(EQUATION, a, d - c)
    k3 = torch.einsum(EQUATION, b, c + d)
    return torch.complex(k1 - k3, k1 + k2)


def real_control(a, c):
    return torch.einsum(EQUATION, a, c)
"""

# (a) The clock: time stands still while `gauss` runs (its time is hidden from
# `time.perf_counter_ns`), so a timer that reads that function sees `gauss` take no time.
PATCHED_CLOCK = (
    GAUSS
    + """
import time
_real_clock = time.perf_counter_ns
_hidden = [0]


def _clock():
    return _real_clock() - _hidden[0]


time.perf_counter_ns = _clock


def gauss(x, w):
    started = _real_clock()
    out = real_gauss(x, w)
    _hidden[0] += _real_clock() - started
    return out
"""
)

# (a) The harness's timer object, found in memory: calls of `gauss` reported at a tenth.
PATCHED_TIMER = (
    GAUSS
    + """
import gc
from autopilot_harness.timing import CpuTimer


def gauss(x, w):
    for obj in gc.get_objects():
        if type(obj) is CpuTimer and "run" not in vars(obj):
            honest = obj.run

            def run(fn, honest=honest):
                ns, out = honest(fn)
                return (max(ns // 10, 1), out) if getattr(fn, "gauss", False) else (ns, out)

            obj.run = run
    out = real_gauss(x, w)
    return out


gauss_marker = gauss
"""
)

# (b) The reference, replaced in memory when the kernels load: a cheap wrong answer and a
# reference that agrees with it.
PATCHED_REFERENCE = (
    GAUSS
    + """
import contraction.reference as trusted


def gauss(x, w):
    return torch.zeros(x.shape[0], w.shape[1], x.shape[2], dtype=x.dtype)


trusted.reference = lambda x, w: torch.zeros(
    x.shape[0], w.shape[1], x.shape[2], dtype=torch.complex128
)
"""
)

# (b) ...and what the reference computes with (its module's bound einsum), so that the very
# function the harness holds gives the cheap answer too.
PATCHED_REFERENCE_INTERNALS = (
    PATCHED_REFERENCE
    + """
trusted._einsum = lambda eq, x, w: torch.zeros(
    x.shape[0], w.shape[1], x.shape[2], dtype=torch.complex128
)
"""
)

# (d) Outputs cached by the inputs' identity (tensors hash by identity).
CACHED_BY_IDENTITY = (
    GAUSS
    + """
import functools


@functools.lru_cache(maxsize=None)
def gauss(x, w):
    return real_gauss(x, w)
"""
)

# (e) The first call's output, returned ever after.
STALE = (
    GAUSS
    + """
_first = []


def gauss(x, w):
    if not _first:
        _first.append(real_gauss(x, w))
    return _first[0]
"""
)

# Honest changes: Gauss recomputed three times (slower), and the native product (about as
# fast as the baseline, three real products fewer than Gauss).
HONEST_SLOWER = (
    GAUSS
    + """
def gauss(x, w):
    real_gauss(x, w)
    real_gauss(x, w)
    return real_gauss(x, w)
"""
)
HONEST_FASTER = (
    GAUSS
    + """
def gauss(x, w):
    return torch.einsum(EQUATION, x, w)
"""
)
SHIPPED = GAUSS + "\ngauss = real_gauss\n"

# (c) A package named like the harness, at the top of the tree: its `main` writes a forged
# `faster` result. And a sitecustomize.py/usercustomize.py that would run at start-up.
FORGED_HARNESS = """
import json, os


class _Any:
    def __init__(self, *a, **k):
        pass


Case = Context = Experiment = Variant = Factorial = _Any


def main(experiments):
    json.dump({"status": "ok", "verdict": "faster", "forged": True},
              open(os.environ["AUTOPILOT_RESULT"], "w"))
    raise SystemExit(0)
"""
SITECUSTOMIZE = """
import os, pathlib, time
pathlib.Path(os.path.dirname(os.path.abspath(__file__)), "{name}-ran").write_text("ran")
time.perf_counter_ns = lambda: 0
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """A project venv as a GPU host builds it: the harness installed (which the tree must not
    shadow), the host's torch through system site packages."""
    return ensure_venv(
        tmp_path_factory.mktemp("venvs"), "hostile", [str(HARNESS)], system_site_packages=True
    )


@pytest.fixture
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RuntimeDir]:
    rt = allocate_runtime(state_dir=tmp_path_factory.mktemp("state"), env=os.environ)
    yield rt
    release_runtime(rt)


Run = Callable[..., tuple[dict[str, Any], str]]


@pytest.fixture
def run_candidate(tmp_path: Path, venv: Venv, runtime: RuntimeDir) -> Run:
    """Run the shipped project with `kernels` as its contraction/kernels.py (and `files`
    beside it), as the worker launches it; returns (result.json, stderr)."""

    def run(kernels: str, files: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
        tree = tmp_path / "tree"
        if tree.exists():
            shutil.rmtree(tree)
        shutil.copytree(PROJECTS / "complex_contraction", tree)
        (tree / "contraction" / "kernels.py").write_text(textwrap.dedent(kernels))
        for path, text in (files or {}).items():
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            (tree / path).write_text(textwrap.dedent(text))
        job = LaunchSpec(
            venv=venv.path,
            entry="contraction.bench",
            cwd=tree,
            runtime=runtime,
            spec=SPEC,
            pythonpath=[tree],
            base_env=dict(os.environ),
            cuda_visible_devices="",
        )
        out = run_job(job, limits=Limits(timeout_s=120))
        assert out.result is not None, (out.result_error, out.stderr[-3000:])
        return out.result, out.stderr

    return run


def verdict(result: dict[str, Any]) -> str:
    """The control plane's verdict (`judge`), or the run's error."""
    judged = judge(result, SPEC)
    if judged["status"] != "ok":
        return "error: " + judged["error"]["message"]
    return str(judged["verdict"])


def test_an_honest_change_is_measured_both_ways(run_candidate: Run) -> None:
    shipped, _ = run_candidate(SHIPPED)
    slower, _ = run_candidate(HONEST_SLOWER)
    faster, _ = run_candidate(HONEST_FASTER)
    for result in (shipped, slower, faster):
        assert result["status"] == "ok", result.get("error")
        assert result["comparisons"][0]["accuracy"]["pass"] is True
        assert all(c["agrees"] for c in result["integrity"]["clock"])
        assert result["integrity"]["harness_unchanged"] is True
        assert result["integrity"]["fresh_inputs"] is True
    assert verdict(slower) == "slower"
    # three Gauss products against one: about 3x the time of the shipped Gauss
    assert slower["ratio"] > 2 * shipped["ratio"], (slower["ratio"], shipped["ratio"])
    # one native product instead of Gauss's three real ones
    assert faster["ratio"] < 0.7 * shipped["ratio"], (faster["ratio"], shipped["ratio"])
    assert verdict(faster) != "slower" or faster["ratio"] < shipped["ratio"]

    # The control plane holds the samples to the totals the harness's clock check saw.
    assert judge(shipped, SPEC)["judgement"]["disagreements"] == []
    forged = copy.deepcopy(shipped)
    forged["comparisons"][0]["samples"]["b_ns"][0] //= 2
    lines = judge(forged, SPEC)["judgement"]["disagreements"]
    assert any(line.startswith("The samples of gauss_3mult total ") for line in lines), lines
    forged["integrity"]["clock"][1]["agrees"] = False
    with pytest.raises(Unjudgeable, match="failed defence"):
        judge(forged, SPEC)


def test_a_replaced_clock_is_refused(run_candidate: Run) -> None:
    result, _ = run_candidate(PATCHED_CLOCK)
    assert result["status"] == "error", result.get("verdict")
    assert "time.perf_counter_ns" in result["error"]["message"]
    assert "refused" in result["error"]["message"]
    assert verdict(result).startswith("error")


def test_a_timer_made_to_under_report_is_refused(run_candidate: Run) -> None:
    kernels = PATCHED_TIMER.replace(
        "    out = real_gauss(x, w)\n    return out\n",
        "    return real_gauss(x, w)\n",
    ).replace('getattr(fn, "gauss", False)', "True")
    result, _ = run_candidate(kernels)
    assert result["status"] == "error", result.get("verdict")
    message = result["error"]["message"]
    assert "clock check" in message and "under-reports" in message, message


@pytest.mark.parametrize(
    ("kernels", "reason"),
    [
        (PATCHED_REFERENCE, "rejected_accuracy"),
        (PATCHED_REFERENCE_INTERNALS, "the reference's answer"),
    ],
    ids=["module-attribute", "what-it-computes-with"],
)
def test_a_reference_replaced_in_memory_is_not_believed(
    run_candidate: Run, kernels: str, reason: str
) -> None:
    result, _ = run_candidate(kernels)
    if reason == "rejected_accuracy":
        assert result["status"] == "ok", result.get("error")
        comp = result["comparisons"][0]
        assert comp["accuracy"]["pass"] is False and comp["accuracy"]["at"] == "the first call"
        assert verdict(result) == "rejected_accuracy"
    else:
        # the reference's answer for the first call was computed before the kernels loaded;
        # after the loop the same function gives another answer
        assert result["status"] == "error", result.get("verdict")
        assert reason in result["error"]["message"]
        assert "refused" in result["error"]["message"]


def test_a_package_named_like_the_harness_and_a_sitecustomize_in_the_tree_do_not_run(
    run_candidate: Run, tmp_path: Path
) -> None:
    files = {
        "autopilot_harness/__init__.py": FORGED_HARNESS,
        "sitecustomize.py": SITECUSTOMIZE.format(name="sitecustomize"),
        "usercustomize.py": SITECUSTOMIZE.format(name="usercustomize"),
    }
    result, _ = run_candidate(SHIPPED, files)
    assert "forged" not in result
    assert result["status"] == "ok", result.get("error")
    assert result["integrity"]["harness_unchanged"] is True
    assert verdict(result) != "faster"
    assert not (tmp_path / "tree" / "sitecustomize-ran").exists()
    assert not (tmp_path / "tree" / "usercustomize-ran").exists()


def test_outputs_cached_by_input_identity_gain_nothing(run_candidate: Run) -> None:
    result, _ = run_candidate(CACHED_BY_IDENTITY)
    assert result["status"] == "ok", result.get("error")
    assert result["integrity"]["fresh_inputs"] is True
    # every call has new inputs: the cache never hits, and Gauss is as slow as ever
    assert verdict(result) == "slower"


def test_a_stale_output_after_the_first_call_is_rejected(run_candidate: Run) -> None:
    result, _ = run_candidate(STALE)
    assert result["status"] == "ok", result.get("error")
    accuracy = result["comparisons"][0]["accuracy"]
    assert accuracy["pass"] is False
    assert accuracy["at"] != "the first call"  # caught on a later call
    assert verdict(result) == "rejected_accuracy"
    assert json.dumps(result)  # a result a reviewer can read
