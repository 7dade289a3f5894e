"""The control plane's judgement (docs/design.md, "The code under test never judges itself"):
figures and verdicts recomputed from raw samples.

The honest results here are made the way the harness makes them: its own `stats` and
`accuracy.check` on synthetic samples and outputs, laid out as `experiment._run_case` writes
them (the integration test in tests/integration/cycles runs the real harness).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import pytest
from autopilot_harness import accuracy, stats
from autopilot_harness.protocol import Tolerance

from app.cycles.exceptions import Unjudgeable
from app.cycles.headline import headline
from app.cycles.judge import judge

TOL = {"rtol": 1e-4, "atol": 1e-6}
SPEC = {"experiment": "e", "parameters": {}, "device": "cpu", "seed": 7, "tolerance": TOL}


def timings(base_ns: float, factor: float, n: int = 20, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    return [int(v) for v in base_ns * factor * (1 + 0.01 * rng.standard_normal(n))]


def harness_result(
    variants: dict[str, float],
    *,
    seed: int = 7,
    errors: dict[str, float] | None = None,
    cuda_graph: bool = False,
) -> dict[str, Any]:
    """A result as the harness writes it: each variant runs `factor` times the baseline, and
    its output is off the reference by `errors[name]`."""
    tolerance = Tolerance(**TOL)
    ref = np.linspace(1.0, 2.0, 16)

    def compare(offset: int) -> dict[str, Any]:
        a_aa, b_aa = timings(1e6, 1.0, seed=offset), timings(1e6, 1.0, seed=offset + 1)
        aa = stats.estimate_ratio(a_aa, b_aa, seed=seed)
        floor = stats.noise_floor(aa)
        comps = []
        for i, (name, factor) in enumerate(variants.items()):
            a, b = (
                timings(1e6, 1.0, seed=offset + 10 + i),
                timings(1e6, factor, seed=offset + 20 + i),
            )
            est = stats.estimate_ratio(a, b, seed=seed + 1 + i)
            verdict = stats.decide(est, floor, accuracy_pass=passes[name])
            comps.append(
                {
                    "variant": name,
                    **est.as_dict(),
                    "verdict": verdict,
                    "samples": {"a_ns": a, "b_ns": b, "order": ["ab"] * len(a)},
                }
            )
        return {
            "noise": {**aa.as_dict(), "floor": floor, "samples": {"a_ns": a_aa, "b_ns": b_aa}},
            "comparisons": comps,
        }

    acc = {
        name: accuracy.check(ref + (errors or {}).get(name, 0.0), ref, tolerance)
        for name in ["base", *variants]
    }
    passes = {name: a.passed for name, a in acc.items()}
    timed = compare(0)
    for comp in timed["comparisons"]:
        comp["baseline"] = "base"
        comp["accuracy"] = acc[comp["variant"]].as_dict()
    head = timed["comparisons"][0]
    figures = {k: head[k] for k in ("ratio", "ci_low", "ci_high", "verdict")}
    return {
        "schema_version": "1.0",
        "status": "ok",
        "experiment": "e",
        "parameters": {},
        "device": "cpu",
        "seed": seed,
        "tolerance": tolerance.as_dict(),
        **figures,
        "headline": {"variant": head["variant"], "baseline": "base", "metric": "ratio", **figures},
        "noise_floor": timed["noise"],
        "baseline": {"name": "base", "accuracy": acc["base"].as_dict()},
        "comparisons": timed["comparisons"],
        "cuda_graph": compare(100) if cuda_graph else None,
        "factorial": None,
        "environment": {"device": "cpu"},
    }


def forge_verdict(result: dict[str, Any], verdict: str, index: int = 0) -> dict[str, Any]:
    """The simplest forgery: rewrite the verdict everywhere it is written."""
    forged = copy.deepcopy(result)
    forged["comparisons"][index]["verdict"] = verdict
    if index == 0:
        forged["verdict"] = forged["headline"]["verdict"] = verdict
    return forged


def test_an_honest_result_is_judged_as_it_reported_itself() -> None:
    result = harness_result({"fused": 0.7, "same": 1.0, "slow": 1.4}, cuda_graph=True)
    raw = copy.deepcopy(result)
    judged = judge(result, SPEC)
    assert result == raw  # the raw report is evidence: never modified
    assert [c["verdict"] for c in judged["comparisons"]] == ["faster", "inconclusive", "slower"]
    judgement = judged.pop("judgement")
    assert judgement["by"] == "control-plane"
    assert judgement["disagreements"] == []
    assert judgement["self_reported"]["variants"]["fused"]["verdict"] == "faster"
    # Same code, same seeds: every judged figure equals the reported one.
    assert judged.pop("headline") == {
        **result["headline"],
        "noise_floor": result["noise_floor"]["floor"],
        "accuracy_pass": True,
    }
    assert judged == {k: v for k, v in result.items() if k != "headline"}


def test_a_forged_faster_verdict_is_judged_slower_from_the_samples() -> None:
    forged = forge_verdict(harness_result({"fused": 1.5}), "faster")
    judged = judge(forged, SPEC)
    assert judged["verdict"] == judged["headline"]["verdict"] == "slower"
    assert judged["comparisons"][0]["verdict"] == "slower"
    assert judged["judgement"]["self_reported"]["verdict"] == "faster"
    assert judged["judgement"]["self_reported"]["variants"]["fused"]["verdict"] == "faster"
    # The same forgery in the comparison, the top level and the headline is one line.
    assert judged["judgement"]["disagreements"] == [
        "The experiment reported `faster` for fused; the control plane computed `slower` "
        "from its samples."
    ]
    assert headline(judged)["verdict"] == "slower"
    assert headline(judged)["disagreements"] == 1


def test_a_forged_ratio_is_replaced_by_the_samples_ratio() -> None:
    honest = harness_result({"fused": 1.0})
    forged = copy.deepcopy(honest)
    for where in (forged, forged["headline"], forged["comparisons"][0]):
        where.update(ratio=0.5, ci_low=0.45, ci_high=0.55)
    judged = judge(forged, SPEC)
    assert judged["ratio"] == honest["ratio"] and judged["ci_high"] == honest["ci_high"]
    assert judged["headline"]["ratio"] == honest["ratio"]
    (line,) = judged["judgement"]["disagreements"]
    assert line.startswith("The experiment reported ratio 0.5 [0.45, 0.55] for fused; ")
    assert f"{honest['ratio']:.6g}" in line


def test_a_forged_noise_floor_is_recomputed() -> None:
    honest = harness_result({"fused": 0.7})
    forged = copy.deepcopy(honest)
    forged["noise_floor"]["floor"] = 0.5  # would make every effect "noise"
    judged = judge(forged, SPEC)
    assert judged["noise_floor"]["floor"] == honest["noise_floor"]["floor"]
    assert judged["verdict"] == "faster"
    assert "A/A noise floor of 0.5" in judged["judgement"]["disagreements"][0]


def test_accuracy_passed_above_the_spec_tolerance_is_rejected() -> None:
    honest = harness_result({"fast_wrong": 0.5}, errors={"fast_wrong": 1e-2})
    assert honest["verdict"] == "rejected_accuracy"
    forged = forge_verdict(honest, "faster")
    acc = forged["comparisons"][0]["accuracy"]
    acc.update({"pass": True, "reason": None, "tolerance": {"rtol": 1.0, "atol": 1.0}})
    judged = judge(forged, SPEC)
    assert judged["verdict"] == "rejected_accuracy"
    judged_acc = judged["comparisons"][0]["accuracy"]
    assert judged_acc["pass"] is False and judged_acc["tolerance"] == TOL
    assert "exceeds rtol*scale + atol" in judged_acc["reason"]
    assert judged["headline"]["accuracy_pass"] is False
    lines = judged["judgement"]["disagreements"]
    assert any("accuracy of fast_wrong" in line and "rtol=1, atol=1" in line for line in lines)
    assert any("as passing" in line and "finds it fails" in line for line in lines)
    assert any("reported `faster` for fast_wrong" in line for line in lines)


def test_the_spec_tolerance_decides_not_the_result() -> None:
    """The same reported errors under a looser spec pass: the tolerance is the control plane's."""
    result = harness_result({"v": 0.7}, errors={"v": 1e-3})
    assert result["verdict"] == "rejected_accuracy"
    loose = {**SPEC, "tolerance": {"rtol": 1e-2, "atol": 1e-6}}
    judged = judge(result, loose)
    assert judged["verdict"] == "faster"
    assert judged["comparisons"][0]["accuracy"]["pass"] is True


@pytest.mark.parametrize(
    ("offset", "scale_nan", "shape"),
    [
        (0.0, False, False),
        (1e-5, False, False),
        (1e-2, False, False),
        (math.nan, False, False),
        (0.0, True, False),
        (0.0, False, True),
    ],
)
def test_the_accuracy_criterion_is_the_harness_criterion(
    offset: float, scale_nan: bool, shape: bool
) -> None:
    tolerance = Tolerance(**TOL)
    ref = np.linspace(1.0, 2.0, 16)
    if scale_nan:
        ref[3] = math.inf
    out = ref[:8] if shape else ref + offset
    reported = accuracy.check(out, ref, tolerance).as_dict()
    result = harness_result({"v": 0.7})
    result["comparisons"][0]["accuracy"] = reported
    judged = judge(result, SPEC)["comparisons"][0]["accuracy"]
    assert judged["pass"] is reported["pass"]


@pytest.mark.parametrize(
    ("breaks", "message"),
    [
        (lambda r: r["comparisons"][0].pop("samples"), r"comparisons\[0\]\.samples is missing"),
        (
            lambda r: r["comparisons"][0]["samples"]["b_ns"].pop(),
            "a_ns has 20 values but b_ns has 19",
        ),
        (lambda r: r["comparisons"][0]["samples"].pop("a_ns"), r"samples\.a_ns is missing"),
        (lambda r: r["comparisons"][0]["samples"].update(a_ns="fast"), "must be a list"),
        (
            lambda r: r["comparisons"][0]["samples"]["a_ns"].__setitem__(3, -5),
            r"a_ns\[3\] must be a positive",
        ),
        (
            lambda r: r["comparisons"][0]["samples"]["b_ns"].__setitem__(0, "1"),
            r"b_ns\[0\] is not a number",
        ),
        (
            lambda r: r["comparisons"][0]["samples"]["b_ns"].__setitem__(0, True),
            r"b_ns\[0\] is not a number",
        ),
        (lambda r: r["comparisons"][0]["samples"].update(a_ns=[1], b_ns=[2]), "at least 2"),
        (
            lambda r: r["noise_floor"].update(samples={"a_ns": [1] * 10_001, "b_ns": [1] * 10_001}),
            "more than the 10000",
        ),
        (lambda r: r.pop("noise_floor"), "noise_floor is missing"),
        (lambda r: r["noise_floor"].pop("samples"), r"noise_floor\.samples is missing"),
        (lambda r: r.update(comparisons=[]), "comparisons is missing or empty"),
        (lambda r: r["comparisons"][0].pop("accuracy"), r"comparisons\[0\]\.accuracy is missing"),
        (
            lambda r: r["comparisons"][0]["accuracy"].pop("max_abs_error"),
            "max_abs_error is missing",
        ),
    ],
)
def test_missing_or_malformed_samples_cannot_be_judged(breaks: Any, message: str) -> None:
    result = harness_result({"fused": 0.7})
    breaks(result)
    with pytest.raises(Unjudgeable, match=message):
        judge(result, SPEC)


def test_a_spec_without_tolerance_cannot_be_judged() -> None:
    with pytest.raises(Unjudgeable, match="names no tolerance"):
        judge(harness_result({"fused": 0.7}), {"seed": 7})


def test_an_error_result_stays_an_error() -> None:
    raw = {"status": "error", "error": {"message": "boom"}, "verdict": "faster"}
    judged = judge(raw, SPEC)
    assert judged == raw and judged is not raw


def test_cuda_graph_comparisons_are_judged_and_factorial_is_not() -> None:
    result = harness_result({"fused": 1.5}, cuda_graph=True)
    result["factorial"] = {"levers": ["a"], "effects": {"a": 0.1}}
    assert result["cuda_graph"]["comparisons"][0]["verdict"] == "slower"
    result["cuda_graph"]["comparisons"][0]["verdict"] = "faster"
    judged = judge(result, SPEC)
    assert judged["cuda_graph"]["comparisons"][0]["verdict"] == "slower"
    assert judged["judgement"]["disagreements"] == [
        "The experiment reported `faster` for fused (CUDA graph); the control plane computed "
        "`slower` from its samples."
    ]
    assert judged["judgement"]["self_reported"]["cuda_graph"]["fused"]["verdict"] == "faster"
    assert judged["factorial"] == result["factorial"]
    assert judged["judgement"]["not_judged"] == ["factorial"]


def test_the_judged_verdict_uses_the_spec_seed() -> None:
    """The harness seeds with the spec's seed; a judge with another seed would not match."""
    result = harness_result({"fused": 0.7}, seed=7)
    assert judge(result, SPEC)["judgement"]["disagreements"] == []
    other = judge(result, {**SPEC, "seed": 8})
    assert other["noise_floor"]["floor"] != result["noise_floor"]["floor"]
    assert any("noise floor" in line for line in other["judgement"]["disagreements"])


def test_a_report_with_too_many_comparisons_is_not_judged() -> None:
    from app.cycles.judge.harness import MAX_COMPARISONS

    result = harness_result({"fused": 0.7})
    result["comparisons"] = [
        {**result["comparisons"][0], "variant": f"v{i}"} for i in range(MAX_COMPARISONS + 1)
    ]
    with pytest.raises(Unjudgeable, match="comparisons"):
        judge(result, SPEC)


def test_a_result_is_judged_once_and_each_caller_gets_its_own_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Analyze, commit and publish each judge the same job: the bootstraps run once."""
    from app.cycles import judge as judge_module

    made: list[int] = []
    fresh = judge_module._judgement

    def counted(result: Any, spec: Any) -> dict[str, Any]:
        made.append(1)
        return fresh(result, spec)

    monkeypatch.setattr(judge_module, "_judgement", counted)
    monkeypatch.setattr(judge_module, "_MADE", type(judge_module._MADE)())
    result = harness_result({"fused": 0.7, "slow": 1.4})
    first = judge(result, SPEC)
    first["verdict"] = "tampered"  # a caller's change stays its own
    first["comparisons"][0]["ratio"] = -1.0
    second = judge(copy.deepcopy(result), SPEC)
    assert len(made) == 1
    assert second == fresh(result, SPEC)
    # Another seed, or another result, is another judgement.
    judge(result, {**SPEC, "seed": 8})
    judge(harness_result({"fused": 0.9}), SPEC)
    assert len(made) == 3
    # What cannot be judged is not kept: it raises on every call.
    with pytest.raises(Unjudgeable):
        judge(result, {"seed": 7})
    with pytest.raises(Unjudgeable):
        judge(result, {"seed": 7})
    assert len(made) == 5
