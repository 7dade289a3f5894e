"""Entry point: ``python -m lora.bench [--spec spec.json] [--result result.json]``.

Per-adapter unfused (XB)A is the baseline; the fused batched form, and (XB)A against X(BA)
(compared with a relative tolerance: reassociation changes rounding, not the answer), are the
variants; both levers are crossed in a factorial, and a batch-size sweep locates the knee
where the fused form's throughput stops growing.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from autopilot_harness import Case, Context, Experiment, Factorial, Variant, main
from autopilot_harness.protocol import SpecError

from lora import reference

KNEE_FRACTION = 0.9

# The reference and its inputs, bound before any code under test is imported: kernels that
# replace `reference.reference` in memory change neither. This package's __init__ is
# protected, so no code of the candidate runs before these lines.
REFERENCE = reference.reference
MAKE_INPUTS = reference.make_inputs
Inputs = reference.Inputs

_kernels: list[ModuleType] = []


def kernels() -> ModuleType:
    """The code under test, imported at the first variant call: after the harness has computed
    the reference's answer for the first call's inputs."""
    if not _kernels:
        from lora import kernels as loaded

        _kernels.append(loaded)
    return _kernels[0]


def _inputs(ctx: Context, tokens: int | None = None, seed: int | None = None) -> reference.Inputs:
    try:
        return MAKE_INPUTS(ctx.parameters, ctx.device, ctx.seed if seed is None else seed, tokens)
    except reference.ShapeError as exc:
        raise SpecError(str(exc)) from exc


def _fields(inp: reference.Inputs) -> tuple[Any, ...]:
    return (inp.x, inp.b, inp.a, inp.ids, inp.order)


def _variant(levers: frozenset[str]) -> Callable[..., Any]:
    """A variant called with one call's inputs (`_fields`), as the harness gives them."""

    def call(*fields: Any) -> Any:
        return kernels().make(Inputs(*fields), levers)()

    return call


def build(ctx: Context) -> Case:
    inp = _inputs(ctx)
    p = ctx.parameters
    xb_a, x_ba = reference.flops_xb_a(p), reference.flops_x_ba(p)
    return Case(
        baseline=Variant("unfused_xb_a", _variant(frozenset()), flops=xb_a),
        variants=[
            Variant("fused_xb_a", _variant(frozenset({"fuse"})), flops=xb_a),
            Variant("unfused_x_ba", _variant(frozenset({"reassociate"})), flops=x_ba),
            Variant("fused_x_ba", _variant(frozenset({"fuse", "reassociate"})), flops=x_ba),
        ],
        reference=lambda *fields: REFERENCE(Inputs(*fields)),
        bytes_moved=reference.io_bytes(p),
        inputs=_fields(inp),
        # every compared call gets inputs of its own: nothing cached from one call helps another
        make_inputs=lambda seed: _fields(_inputs(ctx, seed=seed)),
    )


def factorial(ctx: Context) -> Factorial:
    inp = _inputs(ctx)
    return Factorial(levers=["fuse", "reassociate"], make=lambda c: kernels().make(inp, c))


def study(ctx: Context, case: Case) -> dict[str, Any]:
    """Throughput of unfused and fused (XB)A over a doubling batch size."""
    k = ctx.parameters["adapters"]
    sizes, n = [], k
    while n <= ctx.parameters["sweep_max_tokens"]:
        sizes.append(n)
        n *= 2
    points = []
    for tokens in sizes:
        inp = _inputs(ctx, tokens)
        t_unfused = ctx.median_ns(kernels().make(inp, frozenset()), 5)
        t_fused = ctx.median_ns(kernels().make(inp, frozenset({"fuse"})), 5)
        points.append(
            {
                "tokens": tokens,
                "unfused_ns": t_unfused,
                "fused_ns": t_fused,
                "fused_tokens_per_s": tokens * 1e9 / t_fused,
                "unfused_tokens_per_s": tokens * 1e9 / t_unfused,
                "fused_speedup": t_unfused / t_fused,
            }
        )
    best = max(p["fused_tokens_per_s"] for p in points)
    knee = next(p["tokens"] for p in points if p["fused_tokens_per_s"] >= KNEE_FRACTION * best)
    crossover = next((p["tokens"] for p in points if p["fused_speedup"] > 1.0), None)
    return {
        "batch_sweep": points,
        "knee_tokens": knee,
        "knee_rule": f"smallest batch reaching {KNEE_FRACTION:.0%} of the best fused throughput",
        "fused_wins_from_tokens": crossover,
    }


EXPERIMENTS = {
    "lora": Experiment(
        build=build,
        memory_bytes=reference.memory_bytes,
        study=study,
        factorial=factorial,
        default_repeats=20,
    ),
}

if __name__ == "__main__":
    main(EXPERIMENTS)
