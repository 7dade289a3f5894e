"""Entry point: ``python -m lora.bench [--spec spec.json] [--result result.json]``.

Per-adapter unfused (XB)A is the baseline; the fused batched form, and (XB)A against X(BA)
(compared with a relative tolerance: reassociation changes rounding, not the answer), are the
variants; both levers are crossed in a factorial, and a batch-size sweep locates the knee
where the fused form's throughput stops growing.
"""

from __future__ import annotations

from typing import Any

from autopilot_harness import Case, Context, Experiment, Factorial, Variant, main
from autopilot_harness.protocol import SpecError

from lora import kernels, reference

KNEE_FRACTION = 0.9


def _inputs(ctx: Context, tokens: int | None = None) -> reference.Inputs:
    try:
        return reference.make_inputs(ctx.parameters, ctx.device, ctx.seed, tokens)
    except reference.ShapeError as exc:
        raise SpecError(str(exc)) from exc


def build(ctx: Context) -> Case:
    inp = _inputs(ctx)
    p = ctx.parameters
    xb_a, x_ba = reference.flops_xb_a(p), reference.flops_x_ba(p)
    return Case(
        baseline=Variant("unfused_xb_a", kernels.make(inp, frozenset()), flops=xb_a),
        variants=[
            Variant("fused_xb_a", kernels.make(inp, frozenset({"fuse"})), flops=xb_a),
            Variant("unfused_x_ba", kernels.make(inp, frozenset({"reassociate"})), flops=x_ba),
            Variant(
                "fused_x_ba", kernels.make(inp, frozenset({"fuse", "reassociate"})), flops=x_ba
            ),
        ],
        reference=lambda: reference.reference(inp),
        bytes_moved=reference.io_bytes(p),
        inputs=(inp.x, inp.b, inp.a),
    )


def factorial(ctx: Context) -> Factorial:
    inp = _inputs(ctx)
    return Factorial(levers=["fuse", "reassociate"], make=lambda c: kernels.make(inp, c))


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
        t_unfused = ctx.median_ns(kernels.make(inp, frozenset()), 5)
        t_fused = ctx.median_ns(kernels.make(inp, frozenset({"fuse"})), 5)
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
