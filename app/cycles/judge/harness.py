"""The control plane's judgement of an experiment's result (docs/design.md, "The code under test
never
judges itself").

The experiment reports raw paired samples, accuracy figures and its environment. `judge`
recomputes every figure a verdict rests on from them, with the harness's own statistics
(`autopilot_harness.stats`, imported by the service: never the copy the job ran), against the
seed and tolerance the control plane wrote in the job's spec. An honest result is judged
exactly as it reported itself (same code, same seeds); where the self-report disagrees, the
judged figures win and each disagreement is written down for the reviewer.

What is judged:

- the A/A noise floor, from `noise_floor.samples` (seed = the spec's seed);
- each comparison's ratio and CI, from `comparisons[i].samples` (seed = seed + 1 + i, as
  `autopilot_harness.experiment._compare` seeds them);
- each comparison's accuracy gate, from its reported `max_abs_error` and `scale` against the
  spec's tolerance (`max |error| <= rtol * scale + atol`, `autopilot_harness.accuracy.check`'s
  criterion); the errors themselves can only be as reported, the pass/fail is the control
  plane's;
- each verdict, by `stats.decide` (accuracy first, then the CI, then the noise floor);
- the top-level ratio/CI/verdict and `headline`, rebuilt from the judged first comparison;
- the `cuda_graph` section's comparisons, the same way, when it has any (their accuracy is the
  variant's judged accuracy, as in the harness).

- the `integrity` section (docs/experiments.md, "What the harness defends against"), when the
  result has one: an ok result whose own checks failed (a clock disagreement, the harness
  changed in memory) cannot be judged, and each arm's total of timed samples must be the total
  its clock check saw; a difference is written down for the reviewer.

What is not judged: the `factorial` and `study` sections stay as reported and are listed under
`judgement.not_judged`, so a reader knows their figures are the experiment's own.

A result whose samples or accuracy figures are missing or malformed cannot be judged:
`Unjudgeable` names what is missing, and the cycle fails; the self-reported verdict is never a
fallback. A result whose status is not "ok" is returned as it is: an error stays an error.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from autopilot_harness import stats
from autopilot_harness.protocol import Tolerance

from app.cycles.exceptions import Unjudgeable
from app.cycles.judge.command import judge_head_vs_base
from app.cycles.judge.figures import FIGURES, JUDGE, MAX_PAIRS

NOT_JUDGED = ("factorial", "study")
# ... and how much CPU: each comparison is one bootstrap, so their number is bounded too.
MAX_COMPARISONS = 64


def judge_harness(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The judged copy of a harness experiment's `result` (the raw report, left untouched)
    under the job's `spec`: recomputed figures and verdicts, and a `judgement` section with the
    self-report and the disagreements. Raises `Unjudgeable` when the raw samples or accuracy
    figures are missing or malformed."""
    judged = copy.deepcopy(dict(result))
    if result.get("status") != "ok":
        return judged
    seed, tolerance = _seed(spec), _tolerance(spec)
    lines: list[str] = []
    claims: dict[str, Any] = {k: result.get(k) for k in ("verdict", *FIGURES)}

    comparisons = _comparisons(judged.get("comparisons"), "comparisons")
    passes: dict[str, bool] = {}
    for i, comp in enumerate(comparisons):
        name = _name(comp, f"comparisons[{i}]")
        if name in passes:
            raise Unjudgeable(f"comparisons[{i}].variant {name!r} appears twice")
        comp["accuracy"] = _accuracy(
            comp.get("accuracy"), f"comparisons[{i}].accuracy", name, tolerance, lines
        )
        passes[name] = bool(comp["accuracy"]["pass"])
    baseline = judged.get("baseline")
    if isinstance(baseline, dict) and baseline.get("accuracy") is not None:
        baseline["accuracy"] = _accuracy(
            baseline["accuracy"],
            "baseline.accuracy",
            f"the baseline {baseline.get('name') or ''}".rstrip(),
            tolerance,
            lines,
        )

    noise, floor = _noise(judged.get("noise_floor"), "noise_floor", seed, "", lines)
    judged["noise_floor"] = noise
    claims["variants"] = {}
    judged["comparisons"] = _timing(
        comparisons, "comparisons", seed, floor, passes, "", lines, claims["variants"]
    )

    graph = judged.get("cuda_graph")
    if isinstance(graph, dict) and graph.get("comparisons") is not None:
        graph_comparisons = _comparisons(graph["comparisons"], "cuda_graph.comparisons")
        graph["noise"], graph_floor = _noise(
            graph.get("noise"), "cuda_graph.noise", seed, " (CUDA graph)", lines
        )
        claims["cuda_graph"] = {}
        graph["comparisons"] = _timing(
            graph_comparisons,
            "cuda_graph.comparisons",
            seed,
            graph_floor,
            passes,
            " (CUDA graph)",
            lines,
            claims["cuda_graph"],
        )

    _integrity(judged, lines)

    head = judged["comparisons"][0]
    reported_headline = result.get("headline")
    for source in (claims, reported_headline if isinstance(reported_headline, Mapping) else {}):
        _compare_claim(str(head["variant"]), source, head, lines)
    baseline_name = head.get("baseline")
    if baseline_name is None and isinstance(baseline, Mapping):
        baseline_name = baseline.get("name")
    judged.update({k: head[k] for k in ("verdict", *FIGURES)})
    judged["headline"] = {
        "variant": head["variant"],
        "baseline": baseline_name,
        "metric": "ratio",
        **{k: head[k] for k in ("verdict", *FIGURES)},
        "noise_floor": floor,
        "accuracy_pass": passes[str(head["variant"])],
    }
    judged["judgement"] = {
        "by": JUDGE,
        "seed": seed,
        "tolerance": tolerance.as_dict(),
        "self_reported": claims,
        "disagreements": list(dict.fromkeys(lines)),
        "not_judged": [k for k in NOT_JUDGED if result.get(k) is not None],
    }
    if spec.get("head_vs_base"):
        judge_head_vs_base(judged, spec)
    return judged


def _integrity(judged: Mapping[str, Any], lines: list[str]) -> None:
    """The result's record of the harness's defences, against its own samples."""
    section = judged.get("integrity")
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise Unjudgeable("integrity must be an object, as the harness writes it")
    clock = section.get("clock")
    if section.get("harness_unchanged") is False or (
        isinstance(clock, list)
        and any(isinstance(c, Mapping) and c.get("agrees") is False for c in clock)
    ):
        raise Unjudgeable(
            "the result is ok but its integrity section records a failed defence (a clock "
            "disagreement or a harness changed in memory): its samples cannot be trusted"
        )
    if not isinstance(clock, list) or not clock:
        return
    totals: dict[str, float] = {}
    noise = judged["noise_floor"]["samples"]
    comparisons = judged["comparisons"]
    base = comparisons[0].get("baseline") if comparisons else None
    if isinstance(base, str):
        totals[base] = sum(noise["a_ns"]) + sum(noise["b_ns"])
        totals[base] += sum(sum(c["samples"]["a_ns"]) for c in comparisons)
    for comp in comparisons:
        totals[str(comp["variant"])] = float(sum(comp["samples"]["b_ns"]))
    for check in clock:
        if not isinstance(check, Mapping) or check.get("arm") not in totals:
            continue
        timed = _number(check.get("timed_ns"))
        total = totals[str(check["arm"])]
        if timed is None or not math.isclose(timed, total, rel_tol=1e-9, abs_tol=0.5):
            lines.append(
                f"The samples of {check['arm']} total {total:.0f} ns, but the harness's clock "
                f"check timed {_fmt(check.get('timed_ns'))} ns: the samples were changed after "
                "they were measured."
            )


def disagreements(result: Mapping[str, Any]) -> list[str]:
    """The judgement's disagreement lines of a judged result ([] for one never judged)."""
    judgement = result.get("judgement")
    lines = judgement.get("disagreements") if isinstance(judgement, Mapping) else None
    return [str(line) for line in lines] if isinstance(lines, list) else []


# -- what the control plane asked for -----------------------------------------------------


def _seed(spec: Mapping[str, Any]) -> int:
    seed = spec.get("seed", 0)
    if seed is None:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise Unjudgeable(f"the job's spec has seed {seed!r}; a seed is an integer >= 0")
    return seed


def _tolerance(spec: Mapping[str, Any]) -> Tolerance:
    raw = spec.get("tolerance")
    if not isinstance(raw, Mapping):
        raise Unjudgeable(
            "the job's spec names no tolerance, so accuracy cannot be gated; resubmit the job"
        )
    rtol, atol = _number(raw.get("rtol")), _number(raw.get("atol"))
    if rtol is None or atol is None or rtol < 0 or atol < 0:
        raise Unjudgeable(f"the job's spec has tolerance {dict(raw)!r}; rtol and atol must be >= 0")
    return Tolerance(rtol, atol)


# -- reading the raw report ---------------------------------------------------------------


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _comparisons(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise Unjudgeable(f"{where} is missing or empty: there is nothing to judge")
    if len(raw) > MAX_COMPARISONS:
        raise Unjudgeable(
            f"{where} holds {len(raw)} comparisons; at most {MAX_COMPARISONS} are judged"
        )
    for i, comp in enumerate(raw):
        if not isinstance(comp, dict):
            raise Unjudgeable(f"{where}[{i}] must be an object, got {type(comp).__name__}")
    return raw


def _name(comp: Mapping[str, Any], where: str) -> str:
    name = comp.get("variant")
    if not isinstance(name, str) or not name:
        raise Unjudgeable(f"{where}.variant is missing: each comparison names its variant")
    return name


def _timings(raw: Any, where: str) -> list[float]:
    if raw is None:
        raise Unjudgeable(f"{where} is missing")
    if not isinstance(raw, list):
        raise Unjudgeable(f"{where} must be a list of times in ns, got {type(raw).__name__}")
    for j, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise Unjudgeable(f"{where}[{j}] is not a number: {str(value)[:40]!r}")
        if not math.isfinite(value) or value <= 0:
            raise Unjudgeable(f"{where}[{j}] must be a positive time in ns, got {value!r}")
    return [float(v) for v in raw]


def _samples(section: Mapping[str, Any], where: str) -> tuple[list[float], list[float]]:
    samples = section.get("samples")
    if not isinstance(samples, Mapping):
        raise Unjudgeable(
            f"{where}.samples is missing: the control plane judges from the raw paired "
            "samples (a_ns, b_ns)"
        )
    a = _timings(samples.get("a_ns"), f"{where}.samples.a_ns")
    b = _timings(samples.get("b_ns"), f"{where}.samples.b_ns")
    if len(a) != len(b):
        raise Unjudgeable(
            f"{where}.samples: a_ns has {len(a)} values but b_ns has {len(b)}; samples are pairs"
        )
    if len(a) > MAX_PAIRS:
        raise Unjudgeable(
            f"{where}.samples has {len(a)} pairs, more than the {MAX_PAIRS} the control plane "
            "judges; run fewer repeats"
        )
    if len(a) < 2:
        raise Unjudgeable(
            f"{where}.samples has {len(a)} pair(s); a confidence interval needs at least 2"
        )
    return a, b


# -- judging ------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    number = _number(value)
    return f"{number:.6g}" if number is not None else repr(value)


def _interval(values: Mapping[str, Any]) -> str:
    return (
        f"{_fmt(values.get('ratio'))} [{_fmt(values.get('ci_low'))}, {_fmt(values.get('ci_high'))}]"
    )


def _differs(claimed: Any, judged: float) -> bool:
    number = _number(claimed)
    return number is None or not math.isclose(number, judged, rel_tol=1e-9, abs_tol=1e-12)


def _compare_claim(
    label: str, claim: Mapping[str, Any], judged: Mapping[str, Any], lines: list[str]
) -> None:
    """Note where a claim (a comparison, the top level, the headline) differs from `judged`.

    The wording depends only on the label and the figures, so the same forgery repeated in the
    comparison, the top level and the headline is one line."""
    verdict = claim.get("verdict")
    if verdict is not None and verdict != judged["verdict"]:
        lines.append(
            f"The experiment reported `{verdict}` for {label}; the control plane computed "
            f"`{judged['verdict']}` from its samples."
        )
    if any(claim.get(k) is not None and _differs(claim.get(k), judged[k]) for k in FIGURES):
        lines.append(
            f"The experiment reported ratio {_interval(claim)} for {label}; its samples give "
            f"{_interval(judged)}."
        )


def _noise(
    raw: Any, where: str, seed: int, label: str, lines: list[str]
) -> tuple[dict[str, Any], float]:
    if not isinstance(raw, Mapping):
        raise Unjudgeable(f"{where} is missing: the A/A noise floor is judged from its samples")
    a, b = _samples(raw, where)
    estimate = stats.estimate_ratio(a, b, seed=seed)
    floor = stats.noise_floor(estimate)
    claimed = raw.get("floor")
    if claimed is not None and _differs(claimed, floor):
        lines.append(
            f"The experiment reported an A/A noise floor{label} of {_fmt(claimed)}; its A/A "
            f"samples give {floor:.6g}."
        )
    return {**raw, **estimate.as_dict(), "floor": floor}, floor


def _timing(
    comparisons: list[dict[str, Any]],
    where: str,
    seed: int,
    floor: float,
    passes: Mapping[str, bool],
    label: str,
    lines: list[str],
    claims: dict[str, Any],
) -> list[dict[str, Any]]:
    out = []
    for i, comp in enumerate(comparisons):
        name = _name(comp, f"{where}[{i}]")
        if name not in passes:
            raise Unjudgeable(
                f"{where}[{i}] times {name!r}, which has no accuracy result in comparisons"
            )
        a, b = _samples(comp, f"{where}[{i}]")
        # The harness seeds comparison i with seed + 1 + i (experiment._compare).
        estimate = stats.estimate_ratio(a, b, seed=seed + 1 + i)
        verdict = stats.decide(estimate, floor, accuracy_pass=passes[name])
        claims[name] = {k: comp.get(k) for k in ("verdict", *FIGURES)}
        judged = {**comp, **estimate.as_dict(), "verdict": verdict}
        _compare_claim(name + label, comp, judged, lines)
        out.append(judged)
    return out


def _error_figure(raw: Mapping[str, Any], key: str, where: str) -> float | None:
    """A reported error figure: a number >= 0, or None where the harness wrote a non-finite
    value (a shape mismatch, NaN or inf in the output), which fails the gate."""
    if key not in raw:
        raise Unjudgeable(f"{where}.{key} is missing: accuracy is gated before speed")
    value = raw[key]
    if value is None:
        return None
    number = _number(value)
    if number is None or number < 0:
        raise Unjudgeable(f"{where}.{key} must be a number >= 0 or null, got {value!r}")
    return number


def _accuracy(
    raw: Any, where: str, name: str, tolerance: Tolerance, lines: list[str]
) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise Unjudgeable(
            f"{where} is missing: accuracy is gated before speed, so each variant reports its "
            "max_abs_error and scale"
        )
    err = _error_figure(raw, "max_abs_error", where)
    scale = _error_figure(raw, "scale", where)
    claimed = raw.get("pass", raw.get("passed"))
    judged = dict(raw)
    judged.pop("passed", None)
    bound: float | None = None
    reason: str | None = None
    if err is None or scale is None:
        passed = False
        reason = str(raw.get("reason") or "the output or the reference has non-finite values")
    else:
        # autopilot_harness.accuracy.check's criterion, on the figures it reported.
        bound = tolerance.rtol * scale + tolerance.atol
        passed = err <= bound
        reason = (
            None if passed else f"max |error| {err:.3g} exceeds rtol*scale + atol = {bound:.3g}"
        )
    judged.update({"pass": passed, "reason": reason, "tolerance": tolerance.as_dict()})
    reported_tolerance = raw.get("tolerance")
    if isinstance(reported_tolerance, Mapping) and any(
        _differs(reported_tolerance.get(k), v) for k, v in tolerance.as_dict().items()
    ):
        lines.append(
            f"The experiment checked the accuracy of {name} against rtol="
            f"{_fmt(reported_tolerance.get('rtol'))}, atol={_fmt(reported_tolerance.get('atol'))}; "
            f"the job's spec asked for rtol={tolerance.rtol:g}, atol={tolerance.atol:g}."
        )
    if claimed is not None and bool(claimed) != passed:
        against = (
            f"max |error| {err:.3g} against rtol*scale + atol = {bound:.3g}"
            if err is not None and bound is not None
            else "non-finite errors"
        )
        lines.append(
            f"The experiment reported the accuracy of {name} as "
            f"{'passing' if claimed else 'failing'}; with {against} (the spec's tolerance) "
            f"the control plane finds it {'passes' if passed else 'fails'}."
        )
    return judged
