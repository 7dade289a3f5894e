"""Running one experiment: spec to result.json, with accuracy gated before any verdict.

An entry module builds a :class:`Case` (a baseline, its variants and a reference) for the
spec's parameters and hands it to :func:`main`; everything else - warm-up, interleaved paired
timing, A/A noise floor, verdicts, roofline, thread sweep, factorial, events and the result
file - happens here, the same way for every project.

The variants are the code under test and run in this process, so the measurement defends
itself (docs/experiments.md, "What the harness defends against"): clocks bound at import
(`clocks`), each timed call cross-checked against CLOCK_MONOTONIC (`timing.ClockCheck`), the
harness's own code checked unchanged after the run (`integrity`), the reference's answer
computed before any variant runs and checked again after the loop, fresh inputs for every call
where the case makes them (`Case.make_inputs`), and outputs checked at the first call, at calls
drawn from the seed during the timing loop, and after it.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from autopilot_harness import accuracy, clocks, environment, factorial, integrity, roofline, stats
from autopilot_harness._torch import require_torch
from autopilot_harness.protocol import (
    SCHEMA_VERSION,
    EventStream,
    ExperimentConfig,
    Spec,
    SpecError,
    Tolerance,
    find_config,
    load_config,
    parse_spec,
    read_spec_file,
    write_result,
)
from autopilot_harness.timing import (
    Arm,
    ClockCheck,
    CpuTimer,
    CudaTimer,
    PairedSamples,
    Timer,
    interleaved,
    median_time_ns,
    warm_up,
)

MEMORY_HEADROOM = 0.8
#: Calls of each variant whose output is checked during the timing loop, drawn from the seed
#: (besides the first call and one after the loop).
SPOT_CHECKS = 4


class ExperimentError(RuntimeError):
    """The experiment itself failed (a build or a variant raised); reported, never partial."""


@dataclass
class Variant:
    name: str
    fn: Callable[[], Any]
    flops: float | None = None
    bytes_moved: float | None = None
    description: str = ""


@dataclass
class Case:
    """What one spec measures: variants against a baseline, judged against a reference."""

    baseline: Variant
    variants: list[Variant]
    # The trusted answer (a tensor, or a callable computing one, e.g. in float64); when absent
    # the baseline's own output is the reference.
    reference: Any = None
    flops: float | None = None
    bytes_moved: float | None = None
    dtype: str = "float32"
    # Leaf tensors that need gradients when the backward pass is timed; with `make_inputs`,
    # the inputs of the calls that are not compared (study, CUDA graphs, thread sweep).
    inputs: Sequence[Any] = ()
    # Fresh inputs for one call from a seed (new objects, new values): when given, every
    # compared call gets its own, made outside the timed region, and each variant's `fn` and
    # the reference are called with them as arguments. A variant cannot then reuse an output
    # or a result cached by its inputs' identity or value.
    make_inputs: Callable[[int], Sequence[Any]] | None = None


@dataclass
class Factorial:
    levers: list[str]
    make: Callable[[frozenset[str]], Callable[[], Any]]


@dataclass
class Context:
    spec: Spec
    timer: Timer
    events: EventStream
    project_dir: Path
    repeats: int

    @property
    def parameters(self) -> dict[str, Any]:
        return self.spec.parameters

    @property
    def device(self) -> str:
        return self.spec.device

    @property
    def seed(self) -> int:
        return self.spec.seed

    def option(self, name: str, default: bool = False) -> bool:
        return bool(self.spec.options.get(name, default))

    def log(self, message: str) -> None:
        print(message, file=sys.stderr)
        self.events.send({"type": "log", "message": message})

    def median_ns(self, fn: Callable[[], Any], calls: int | None = None) -> float:
        """Warmed-up median time of ``fn`` alone (for studies, not for A/B verdicts)."""
        warm_up(fn, self.timer, max_seconds=2.0)
        return median_time_ns(fn, self.timer, calls or max(self.repeats // 2, 5))


@dataclass
class Experiment:
    build: Callable[[Context], Case]
    memory_bytes: Callable[[Mapping[str, Any]], float] | None = None
    study: Callable[[Context, Case], dict[str, Any]] | None = None
    factorial: Callable[[Context], Factorial] | None = None
    default_repeats: int = 30
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def available_memory(device: str) -> float | None:
    if device == "cuda":
        torch = require_torch()
        free, _total = torch.cuda.mem_get_info()
        return float(free)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(needed: float, device: str) -> None:
    free = available_memory(device)
    if free is not None and needed > MEMORY_HEADROOM * free:
        raise SpecError(
            f"these shapes need about {needed / 2**30:.2f} GiB but {device} has "
            f"{free / 2**30:.2f} GiB available ({MEMORY_HEADROOM:.0%} usable): use smaller shapes"
        )


def _call_checked(variant: Variant, args: Sequence[Any] = ()) -> Any:
    try:
        return variant.fn(*args)
    except Exception as exc:
        raise ExperimentError(
            f"variant {variant.name!r} raised {type(exc).__name__}: {exc}"
        ) from exc


def _with_backward(fn: Callable[[], Any], inputs: Sequence[Any]) -> Callable[[], Any]:
    def run() -> Any:
        for tensor in inputs:
            tensor.grad = None
        out = fn()
        (out.real.sum() if out.is_complex() else out.sum()).backward()
        return out

    return run


def _graphed(fn: Callable[[], Any]) -> Callable[[], Any]:
    torch = require_torch()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _clock_checks(
    baseline: str, aa: PairedSamples, ab: Mapping[str, PairedSamples], timer: Timer
) -> list[ClockCheck]:
    """Each arm's samples against the outside clock, the baseline's from every pair."""
    base_t, base_w = aa.a_ns + aa.b_ns, aa.a_wall_ns + aa.b_wall_ns
    checks = []
    for name, samples in ab.items():
        base_t, base_w = base_t + samples.a_ns, base_w + samples.a_wall_ns
        checks.append(ClockCheck.of(name, samples.b_ns, samples.b_wall_ns, timer))
    return [ClockCheck.of(baseline, base_t, base_w, timer), *checks]


def _compare(
    baseline: Callable[[], Any] | Arm,
    candidates: Mapping[str, Callable[[], Any] | Arm],
    ctx: Context,
    *,
    stage: str,
    accuracy_pass: Mapping[str, bool],
    baseline_name: str = "baseline",
) -> dict[str, Any]:
    def progress(done: int, total: int) -> None:
        ctx.events.send({"type": "progress", "stage": stage, "done": done, "total": total})

    aa, ab = interleaved(
        baseline,
        dict(candidates),
        pairs=ctx.repeats,
        timer=ctx.timer,
        seed=ctx.seed,
        on_round=progress,
    )
    clock = _clock_checks(baseline_name, aa, ab, ctx.timer)
    for check in clock:
        if not check.agrees:
            raise ExperimentError(
                f"the clock check of the {stage} stage failed: {check.reason}. The samples "
                "cannot be trusted; a run whose timer disagrees with the outside clock is "
                "refused (was the timer or a clock replaced?)"
            )
    aa_est = stats.estimate_ratio(aa.a_ns, aa.b_ns, seed=ctx.seed)
    floor = stats.noise_floor(aa_est)
    comparisons = []
    for i, (name, samples) in enumerate(ab.items()):
        est = stats.estimate_ratio(samples.a_ns, samples.b_ns, seed=ctx.seed + 1 + i)
        verdict = stats.decide(est, floor, accuracy_pass=accuracy_pass[name])
        ctx.events.send(
            {
                "type": "sample",
                "stage": stage,
                "variant": name,
                "a_ns": samples.a_ns,
                "b_ns": samples.b_ns,
            }
        )
        comparisons.append(
            {"variant": name, **est.as_dict(), "verdict": verdict, "samples": samples.as_dict()}
        )
    return {
        "noise": {**aa_est.as_dict(), "floor": floor, "samples": aa.as_dict()},
        "comparisons": comparisons,
        "clock": [c.as_dict() for c in clock],
    }


def _bound(fn: Callable[..., Any], args: Sequence[Any]) -> Callable[[], Any]:
    if not args:
        return fn
    return lambda: fn(*args)


def _copy(value: Any) -> Any:
    if hasattr(value, "detach"):
        return value.detach().clone()
    return np.array(value, copy=True)


def _leaves(args: Sequence[Any]) -> list[Any]:
    out = []
    for arg in args:
        if hasattr(arg, "requires_grad_") and (arg.is_floating_point() or arg.is_complex()):
            arg = arg.detach().requires_grad_(True)
        out.append(arg)
    return out


class _Checks:
    """Where outputs are checked: inputs for each compared call (fresh ones from
    `Case.make_inputs`, one seed per call from a stream of the spec's seed, else the case's own),
    the reference's answer for them computed before the variant sees them, and each variant's
    worst accuracy over the first call, the calls drawn for checking during the timing loop and
    one call after it."""

    def __init__(self, case: Case, ctx: Context) -> None:
        self.case, self.ctx = case, ctx
        self.tolerance = ctx.spec.tolerance
        self.fresh = case.make_inputs is not None
        # not secrets: reproducible from the seed, which the control plane draws per job
        self._seeds = random.Random(f"{ctx.seed}/inputs")  # noqa: S311
        self._draws = random.Random(f"{ctx.seed}/checks")  # noqa: S311
        self._gate_seed = self._seeds.randrange(2**31)
        self.fixed_expected: Any = None
        self.worst: dict[str, accuracy.Accuracy] = {}
        self.where: dict[str, str | None] = {}
        self.count: dict[str, int] = {}
        self.passes: dict[str, bool] = {}
        self._at: dict[str, set[int]] = {}

    def gate_inputs(self) -> tuple[Any, ...]:
        """The first call's inputs (the same values, new objects, each time asked)."""
        if self.case.make_inputs is None:
            return ()
        return tuple(self.case.make_inputs(self._gate_seed))

    def expected(self, args: Sequence[Any]) -> Any:
        """The reference's answer for `args`; without a reference, the baseline's (None before
        the gate has run it, for a case without `make_inputs`)."""
        ref = self.case.reference
        torch = require_torch()
        with torch.no_grad():
            if self.fresh:  # no reference: the baseline's answer for these inputs is it
                out = ref(*args) if ref is not None else self.case.baseline.fn(*args)
            elif self.fixed_expected is None:
                out = ref() if callable(ref) else ref
                self.fixed_expected = out
            else:
                out = self.fixed_expected
        return _copy(out) if out is not None else None

    def record(self, name: str, output: Any, expected: Any, where: str) -> None:
        got = accuracy.check(output, expected, self.tolerance)
        self.count[name] = self.count.get(name, 0) + 1
        old = self.worst.get(name)
        if old is None or (old.passed and (not got.passed or _margin(got) > _margin(old))):
            self.worst[name] = got
            self.where[name] = where
        self.passes[name] = self.worst[name].passed

    def draw(self, calls: Mapping[str, int]) -> None:
        """Which of each variant's timed calls (numbered from 1) have their output checked."""
        for name, n in calls.items():
            self._at[name] = set(self._draws.sample(range(1, n + 1), min(SPOT_CHECKS, n)))

    def _inputs(self) -> tuple[Any, ...]:
        if self.case.make_inputs is None:
            return ()
        return tuple(self.case.make_inputs(self._seeds.randrange(2**31)))

    def arm(self, variant: Variant, backward: bool) -> Arm:
        """The variant as the timing loop calls it: fresh inputs made, and the expected answer
        computed for a call drawn for checking, before the timed region; that call's output
        checked after it."""
        name, fn = variant.name, variant.fn
        state: dict[str, Any] = {"index": 0, "expected": None}

        def prepare() -> Callable[[], Any]:
            state["index"] += 1
            args: Sequence[Any] = self._inputs()
            checked = state["index"] in self._at.get(name, ())
            state["expected"] = self.expected(args) if checked else None
            if backward and self.fresh:
                args = _leaves(args)
                return _with_backward(_bound(fn, args), [a for a in args if _is_leaf(a)])
            if backward:
                return _with_backward(fn, self.case.inputs)
            return _bound(fn, args)

        def inspect(output: Any) -> None:
            expected, state["expected"] = state["expected"], None
            if expected is not None:
                self.record(name, output, expected, f"timed call {state['index']}")

        return Arm(prepare, inspect)

    def after_loop(self, variant: Variant) -> None:
        args = self._inputs() if self.fresh else ()
        expected = self.expected(args)
        torch = require_torch()
        with torch.no_grad():
            out = _call_checked(variant, args)
        self.record(variant.name, out, expected, "the call after the timing loop")

    def reference_unchanged(self, before: Any) -> None:
        """The reference's answer for the first call's inputs, computed again after the loop,
        must be the one computed before any variant ran: else the reference (or what it computes
        with) was changed in memory during the run, and the run is refused."""
        if self.case.reference is None:
            return
        if self.fresh:
            after = self.expected(self.gate_inputs())
        else:
            ref = self.case.reference
            torch = require_torch()
            with torch.no_grad():
                after = ref() if callable(ref) else ref
        tight = Tolerance(self.tolerance.rtol / 100, self.tolerance.atol / 100)
        same = accuracy.check(after, before, tight)
        if not same.passed:
            raise ExperimentError(
                "the reference's answer for the first call's inputs changed during the run "
                f"({same.reason}): the reference, or what it computes with, was replaced in "
                "memory after the harness computed it; the run is refused"
            )

    def report(self, name: str) -> dict[str, Any]:
        return {**self.worst[name].as_dict(), "checks": self.count[name], "at": self.where[name]}


def _is_leaf(value: Any) -> bool:
    return bool(getattr(value, "requires_grad", False))


def _margin(acc: accuracy.Accuracy) -> float:
    """How close to its bound an accuracy check came (> 1: it failed)."""
    bound = acc.tolerance.rtol * acc.scale + acc.tolerance.atol
    return acc.max_abs_error / bound if bound > 0 else float("inf")


def _ratio_estimate(comp: Mapping[str, Any]) -> stats.RatioEstimate:
    return stats.RatioEstimate(comp["ratio"], comp["ci_low"], comp["ci_high"], comp["n"])


def _decide_again(section: dict[str, Any], passes: Mapping[str, bool]) -> None:
    """The verdicts of `section` with the accuracy known after every check."""
    floor = section["noise"]["floor"]
    for comp in section["comparisons"]:
        comp["verdict"] = stats.decide(
            _ratio_estimate(comp), floor, accuracy_pass=passes[comp["variant"]]
        )


def _build_case(experiment: Experiment, ctx: Context) -> Case:
    """The spec's case, refused before any of it runs when it cannot be measured: shapes that
    do not fit the device, a build that raises, clashing names, or fresh inputs without a
    reference that takes them."""
    spec = ctx.spec
    if experiment.memory_bytes is not None:
        check_memory(float(experiment.memory_bytes(spec.parameters)), spec.device)
    try:
        case = experiment.build(ctx)
    except (SpecError, ExperimentError):
        raise
    except Exception as exc:
        raise ExperimentError(f"building the case raised {type(exc).__name__}: {exc}") from exc
    names = [case.baseline.name, *(v.name for v in case.variants)]
    if len(set(names)) != len(names) or not case.variants:
        raise ExperimentError(
            f"a case needs distinct variant names and at least one variant: {names}"
        )
    fresh = case.make_inputs is not None
    if fresh and case.reference is not None and not callable(case.reference):
        raise ExperimentError("a case with make_inputs needs a callable reference(*inputs)")
    return case


class _CaseRun:
    """One case measured, phase by phase, in the order `_run_case` calls the phases.

    The reference's answer for the first call's inputs and the timing loop's samples are not
    attributes: `_run_case` holds them as locals and hands them to the phases that need them,
    and lets go of the answer (a full-size tensor, on the GPU too) once it has been checked
    again after the loop.
    """

    def __init__(self, experiment: Experiment, ctx: Context) -> None:
        # torch and the spec as they are before the project's build runs
        self.torch = require_torch()
        self.experiment, self.ctx, self.spec = experiment, ctx, ctx.spec
        self.case = _build_case(experiment, ctx)
        self.checks = _Checks(self.case, ctx)

    def gate(self) -> Any:
        """Each variant's first call checked; returns the answer it was checked against."""
        case, checks = self.case, self.checks
        names = [case.baseline.name, *(v.name for v in case.variants)]
        self.ctx.log(f"accuracy gate for {', '.join(names)}")
        # The reference's answer comes first, before any variant has run (docs/experiments.md,
        # "What the harness defends against").
        expected = checks.expected(checks.gate_inputs())
        for variant in [case.baseline, *case.variants]:
            args = checks.gate_inputs()
            with self.torch.no_grad():
                out = _call_checked(variant, args)
            if expected is None:  # no reference: the baseline's answer is the reference
                expected = out
                checks.fixed_expected = out
            checks.record(variant.name, out, expected, "the first call")
            del out
        return expected

    def timed_calls(self, backward: bool) -> tuple[dict[str, Callable[[], Any]], dict[str, Arm]]:
        """Each variant as warm-up, graph capture and the thread sweep call it (on the case's
        own inputs), and as the timing loop calls it (`_Checks.arm`)."""
        case = self.case
        fixed = tuple(case.inputs) if self.checks.fresh else ()
        calls: dict[str, Callable[[], Any]] = {}
        arms: dict[str, Arm] = {}
        for variant in [case.baseline, *case.variants]:
            fn = _bound(variant.fn, fixed)
            if backward:
                for tensor in case.inputs:
                    if tensor.is_floating_point() or tensor.is_complex():
                        tensor.requires_grad_(True)
                fn = _with_backward(fn, case.inputs)
            calls[variant.name] = fn
            arms[variant.name] = self.checks.arm(variant, backward)
        return calls, arms

    def warm_ups(self, calls: Mapping[str, Callable[[], Any]]) -> dict[str, dict[str, Any]]:
        """Each variant called until its times settle; what that took, for the result."""
        warmups = {}
        for name, fn in calls.items():
            try:
                w = warm_up(fn, self.ctx.timer)
            except Exception as exc:
                raise ExperimentError(
                    f"variant {name!r} raised {type(exc).__name__}: {exc}"
                ) from exc
            warmups[name] = {"calls": w.calls, "settled": w.settled, "median_ns": w.median_ns}
        return warmups

    def timing_loop(self, arms: Mapping[str, Arm]) -> dict[str, Any]:
        """The interleaved rounds, with the calls whose outputs are checked drawn first."""
        case, ctx = self.case, self.ctx
        n_candidates = len(case.variants)
        self.checks.draw(
            {case.baseline.name: ctx.repeats * (2 + n_candidates)}
            | {v.name: ctx.repeats for v in case.variants}
        )
        ctx.log(f"timing {ctx.repeats} interleaved rounds")
        return _compare(
            arms[case.baseline.name],
            {v.name: arms[v.name] for v in case.variants},
            ctx,
            stage="timing",
            # updated as calls are checked; verdicts are decided again after the loop
            accuracy_pass=self.checks.passes,
            baseline_name=case.baseline.name,
        )

    def check_after_loop(self, gate_expected: Any) -> None:
        """One more checked call of each variant, and the reference's answer for the first
        call's inputs computed again (`_Checks.reference_unchanged`)."""
        self.ctx.log("checking outputs and the reference after the timing loop")
        for variant in [self.case.baseline, *self.case.variants]:
            self.checks.after_loop(variant)
        self.checks.reference_unchanged(gate_expected)

    def final_verdicts(self, timed: dict[str, Any], warmups: Mapping[str, Any]) -> None:
        """The timing loop's verdicts with every check's accuracy, and what each comparison
        was against, how accurate it was and how it warmed up."""
        _decide_again(timed, self.checks.passes)
        for comp in timed["comparisons"]:
            comp["baseline"] = self.case.baseline.name
            comp["accuracy"] = self.checks.report(comp["variant"])
            comp["warmup"] = warmups[comp["variant"]]

    def graph_replays(
        self, calls: Mapping[str, Callable[[], Any]], backward: bool
    ) -> dict[str, Any] | None:
        """The variants' CUDA-graph replays compared, when the spec asks and the device has
        them; the forward pass only."""
        ctx, case = self.ctx, self.case
        if not (ctx.option("cuda_graph") and self.spec.device == "cuda"):
            return None
        if backward:
            return {"skipped": "graph replay is measured for the forward pass only"}
        ctx.log("timing CUDA-graph replays")
        graphed = {name: _graphed(fn) for name, fn in calls.items()}
        return _compare(
            graphed[case.baseline.name],
            {v.name: graphed[v.name] for v in case.variants},
            ctx,
            stage="cuda_graph",
            accuracy_pass=self.checks.passes,
        )

    def peak(self) -> dict[str, Any] | None:
        """The device's peak: known for a named GPU, measured on a CPU."""
        device = self.spec.device
        peak = (
            roofline.known_peak(self.torch.cuda.get_device_name(), self.case.dtype)
            if device == "cuda"
            else None
        )
        if peak is None:
            peak = roofline.cpu_probe(self.ctx.timer) if device == "cpu" else None
        return peak

    def achieved(self, timed: Mapping[str, Any]) -> dict[str, Any]:
        """What each variant achieved of the peak at its median time in the timing loop."""
        case = self.case
        peak = self.peak()
        medians = {case.baseline.name: float(np.median(timed["noise"]["samples"]["a_ns"]))}
        for comp in timed["comparisons"]:
            medians[comp["variant"]] = float(np.median(comp["samples"]["b_ns"]))
        roof: dict[str, Any] = {"peak": peak, "variants": {}}
        for variant in [case.baseline, *case.variants]:
            flops = variant.flops if variant.flops is not None else case.flops
            moved = variant.bytes_moved if variant.bytes_moved is not None else case.bytes_moved
            roof["variants"][variant.name] = roofline.achieved(
                medians[variant.name], flops, moved, peak
            )
        return roof

    def thread_sweep(self, calls: dict[str, Callable[[], Any]]) -> dict[str, Any] | None:
        if not (self.spec.device == "cpu" and self.ctx.option("thread_sweep", default=True)):
            return None
        self.ctx.log("thread sweep")
        return roofline.thread_sweep(calls, self.ctx.timer)

    def study(self) -> dict[str, Any] | None:
        if self.experiment.study is None:
            return None
        self.ctx.log("study")
        try:
            return self.experiment.study(self.ctx, self.case)
        except Exception as exc:
            raise ExperimentError(f"the study raised {type(exc).__name__}: {exc}") from exc

    def figures(
        self,
        timed: Mapping[str, Any],
        warmups: Mapping[str, Any],
        sections: Mapping[str, Any],
        untouched: bool,
    ) -> dict[str, Any]:
        """The result's figures: the first variant's verdict as the headline, then every
        comparison, the `sections` after the timing loop, and what held of the defences."""
        base = self.case.baseline.name
        head = timed["comparisons"][0]
        verdict = {key: head[key] for key in ("ratio", "ci_low", "ci_high", "verdict")}
        return {
            **verdict,
            "headline": {
                "variant": head["variant"],
                "baseline": base,
                "metric": "ratio",
                **verdict,
            },
            "noise_floor": timed["noise"],
            "baseline": {
                "name": base,
                "accuracy": self.checks.report(base),
                "warmup": warmups[base],
            },
            "comparisons": timed["comparisons"],
            **sections,
            "integrity": {
                "clock": timed["clock"],
                "harness_unchanged": untouched,
                "fresh_inputs": self.checks.fresh,
                "output_checks": dict(self.checks.count),
            },
        }


def _factorial(experiment: Experiment, ctx: Context) -> dict[str, Any] | None:
    """Every combination of the experiment's levers timed against none of them, and each
    lever's effect (`factorial.summarise`); None without levers or when the spec turns it off."""
    if experiment.factorial is None or not ctx.option("factorial", default=True):
        return None
    ctx.log("factorial over levers")
    design = experiment.factorial(ctx)
    combos = factorial.combinations(design.levers)
    fns = {factorial.label(c): design.make(c) for c in combos}
    for fn in fns.values():
        warm_up(fn, ctx.timer, max_seconds=2.0)
    base_label = factorial.label(frozenset())
    timed = _compare(
        fns[base_label],
        {k: v for k, v in fns.items() if k != base_label},
        ctx,
        stage="factorial",
        accuracy_pass=dict.fromkeys(fns, True),
    )
    by_label = {c["variant"]: c for c in timed["comparisons"]}
    estimates = {c: _ratio_estimate(by_label[factorial.label(c)]) for c in combos if c}
    fact = factorial.summarise(design.levers, estimates)
    fact["noise_floor"] = timed["noise"]["floor"]
    return fact


def _run_case(experiment: Experiment, ctx: Context) -> dict[str, Any]:
    """The spec's case built and measured: accuracy gate, warm-up, the timing loop, the checks
    after it, then the sections that take no part in a verdict."""
    case_run = _CaseRun(experiment, ctx)
    gate_expected = case_run.gate()
    backward = ctx.option("backward")
    calls, arms = case_run.timed_calls(backward)
    warmups = case_run.warm_ups(calls)
    timed = case_run.timing_loop(arms)
    case_run.check_after_loop(gate_expected)
    del gate_expected
    case_run.final_verdicts(timed, warmups)
    sections = {
        "cuda_graph": case_run.graph_replays(calls, backward),
        "roofline": case_run.achieved(timed),
        "thread_sweep": case_run.thread_sweep(calls),
        "factorial": _factorial(experiment, ctx),
        "study": case_run.study(),
    }
    untouched = _untouched(ctx)
    return case_run.figures(timed, warmups, sections, untouched)


def _untouched(ctx: Context) -> bool:
    """True, or ExperimentError naming what of the harness, its timer or the clocks was
    replaced in memory during the run (`integrity`, `clocks`)."""
    changed = _SNAPSHOT.changed() + clocks.replaced()
    if vars(ctx.timer).keys() & {"run", "time_ns"}:
        changed.append(f"the timer object's {sorted(vars(ctx.timer).keys() & {'run', 'time_ns'})}")
    if changed:
        raise ExperimentError(
            "the measurement was changed in memory during the run: "
            + ", ".join(changed[:8])
            + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
            + "; a run whose harness or clocks were replaced is refused"
        )
    return True


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Run an autopilot experiment.")
    parser.add_argument(
        "--spec",
        type=Path,
        help="spec JSON (default: $AUTOPILOT_SPEC, else the CPU defaults from autopilot.toml)",
    )
    parser.add_argument(
        "--result",
        type=Path,
        help="where result.json goes (default: $AUTOPILOT_RESULT, else ./result.json)",
    )
    return parser.parse_args(argv)


def _set_seeds(seed: int) -> None:
    torch = require_torch()
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - seeds user code that uses the legacy global RNG
    torch.manual_seed(seed)


def _requested(
    experiments: Mapping[str, Experiment], spec_path: Path | None, cwd: Path
) -> tuple[Any, dict[str, ExperimentConfig], Path]:
    """The spec as given (its file's, else the first experiment of autopilot.toml that this
    entry module provides), the project's experiments and where they are declared."""
    entry_dir = Path(sys.argv[0]).resolve().parent if sys.argv and sys.argv[0] else cwd
    config_path = find_config(cwd, entry_dir)
    configs = load_config(config_path)
    if spec_path is not None:
        return read_spec_file(spec_path), configs, config_path
    runnable = [name for name in configs if name in experiments]
    if not runnable:
        raise SpecError(f"none of {sorted(experiments)} is declared in {config_path}")
    return {"experiment": runnable[0]}, configs, config_path


def _named(raw: Any) -> dict[str, Any]:
    """The experiment and parameters a spec names, as far as they read before it is parsed:
    an error result says what was asked for."""
    if not isinstance(raw, Mapping):
        return {}
    return {
        "experiment": raw.get("experiment") if isinstance(raw.get("experiment"), str) else None,
        "parameters": raw.get("parameters") if isinstance(raw.get("parameters"), Mapping) else None,
    }


def _refuse_unrunnable(
    spec: Spec, experiments: Mapping[str, Experiment], config_path: Path
) -> None:
    """SpecError or ExperimentError when the spec cannot be run here, or not trusted."""
    if spec.experiment not in experiments:
        raise SpecError(
            f"experiment {spec.experiment!r} is declared in {config_path.name} "
            f"but this entry module provides only {sorted(experiments)}"
        )
    if clocks.TAMPERED_AT_IMPORT:
        raise ExperimentError(
            f"{', '.join(clocks.replaced())} had been replaced before the harness loaded: "
            "the project's code ran before the harness and changed the clocks; refused"
        )
    torch = require_torch()
    if spec.device == "cuda" and not torch.cuda.is_available():
        raise SpecError("device 'cuda' was requested but torch sees no CUDA device")


def _measured(
    spec: Spec,
    experiment: Experiment,
    configs: Mapping[str, ExperimentConfig],
    events: EventStream,
    project_dir: Path,
) -> dict[str, Any]:
    """The fields of an ok result: the spec's experiment run, seeded, on its device's timer."""
    repeats = spec.repeats or experiment.default_repeats
    _set_seeds(spec.seed)
    timer: Timer = CudaTimer() if spec.device == "cuda" else CpuTimer()
    ctx = Context(spec=spec, timer=timer, events=events, project_dir=project_dir, repeats=repeats)
    body = _run_case(experiment, ctx)
    return dict(
        status="ok",
        device=spec.device,
        seed=spec.seed,
        repeats=repeats,
        tolerance=spec.tolerance.as_dict(),
        options=spec.options,
        metric=configs[spec.experiment].metric,
        direction=configs[spec.experiment].direction,
        **body,
        error=None,
    )


def _error(exc: Exception) -> dict[str, Any]:
    """What an error result says of `exc` while it is handled: a refusal's own message; of
    anything else, also its type and the start of its traceback."""
    if isinstance(exc, SpecError | ExperimentError):
        return {"type": type(exc).__name__, "message": str(exc)}
    return {
        "type": type(exc).__name__,
        "message": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc(limit=8),
    }


def _error_result(result: Mapping[str, Any], spec: Spec | None) -> dict[str, Any]:
    """A failed run's result: what was asked and what went wrong, none of the figures it
    half-filled."""
    kept = {k: result[k] for k in ("schema_version", "status", "experiment", "parameters", "error")}
    if spec is not None:
        kept["device"] = spec.device
    return kept


def _stamp(result: dict[str, Any], spec: Spec | None, cwd: Path, started: float) -> None:
    """The environment the run saw, when it started and how long it took."""
    try:
        result["environment"] = environment.capture(spec.device if spec else "cpu", cwd)
    except Exception as exc:  # an unreadable environment must not hide the result itself
        result["environment"] = {"error": f"{type(exc).__name__}: {exc}"}
    result["started_at"] = datetime.fromtimestamp(started, UTC).isoformat()
    result["duration_s"] = round(time.time() - started, 3)


def run(
    experiments: Mapping[str, Experiment],
    argv: Sequence[str] | None = None,
    *,
    events: EventStream | None = None,
) -> tuple[int, dict[str, Any], Path]:
    """Run the spec'd experiment; returns (exit code, result, result path). Never raises."""
    events = events or EventStream(os.environ.get("AUTOPILOT_EVENTS"))
    events.send({"type": "started", "pid": os.getpid(), "at": time.time()})
    started = time.time()
    args = _parse_args(argv)
    spec_path = args.spec or (Path(p) if (p := os.environ.get("AUTOPILOT_SPEC")) else None)
    result_path = args.result or Path(os.environ.get("AUTOPILOT_RESULT") or "result.json")
    cwd = Path.cwd()
    spec: Spec | None = None
    result: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "status": "error",
        "experiment": None,
        "parameters": None,
    }
    try:
        raw, configs, config_path = _requested(experiments, spec_path, cwd)
        result.update(_named(raw))
        spec = parse_spec(raw, configs)
        result["parameters"] = spec.parameters
        _refuse_unrunnable(spec, experiments, config_path)
        experiment = experiments[spec.experiment]
        result.update(_measured(spec, experiment, configs, events, config_path.parent))
        code = 0
    except Exception as exc:
        result.update(status="error", error=_error(exc))
        code = 1
    if result["status"] == "error":
        result = _error_result(result, spec)
    _stamp(result, spec, cwd, started)
    try:
        write_result(result_path, result)
    except (OSError, ValueError) as exc:
        print(f"cannot write {result_path}: {exc}", file=sys.stderr)
        code = 1
    events.send({"type": "result", "status": result["status"], "path": str(result_path)})
    events.close()
    return code, result, result_path


def _summary(result: Mapping[str, Any]) -> str:
    if result["status"] != "ok":
        return f"error: {result['error']['message']}"
    lines = [f"{result['experiment']}: noise floor {result['noise_floor']['floor']:.2%}"]
    for comp in result["comparisons"]:
        lines.append(
            f"  {comp['variant']} / {comp['baseline']}: ratio {comp['ratio']:.4f} "
            f"[{comp['ci_low']:.4f}, {comp['ci_high']:.4f}] -> {comp['verdict']}"
            f" (max rel error {comp['accuracy']['max_rel_error']})"
        )
    return "\n".join(lines)


def main(experiments: Mapping[str, Experiment], argv: Sequence[str] | None = None) -> None:
    """Entry point for ``python -m <entry>``: run, write result.json, exit 0 (ok) or 1 (error)."""
    code, result, path = run(experiments, argv)
    print(_summary(result))
    print(f"result: {path}")
    raise SystemExit(code)


# What the harness's code is once loaded, before any project code runs (`integrity`).
_SNAPSHOT = integrity.Snapshot()

__all__ = [
    "Case",
    "Context",
    "Experiment",
    "ExperimentError",
    "Factorial",
    "Tolerance",
    "Variant",
    "main",
    "run",
]
