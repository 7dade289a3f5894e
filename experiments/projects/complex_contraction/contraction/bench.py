"""Entry point: ``python -m contraction.bench [--spec spec.json] [--result result.json]``.

Compares the 3-multiply Gauss form against native complex einsum, and measures
R = t_complex / t_real against a same-library real GEMM of the same shape: Gauss replaces one
complex product (R real-GEMM times) by three real ones, so it can win only when R > 3, and its
4/3 ceiling needs R >= 4.
"""

from __future__ import annotations

from typing import Any

from autopilot_harness import Case, Context, Experiment, Variant, main

from contraction import kernels, reference


def build(ctx: Context) -> Case:
    x, w = reference.make_inputs(ctx.parameters, ctx.device, ctx.seed)
    macs = reference.complex_macs(ctx.parameters)
    io = reference.io_bytes(ctx.parameters)
    return Case(
        baseline=Variant("native_einsum", lambda: kernels.native(x, w), flops=8.0 * macs),
        variants=[Variant("gauss_3mult", lambda: kernels.gauss(x, w), flops=6.0 * macs)],
        reference=lambda: reference.reference(x, w),
        bytes_moved=float(io),
        dtype="complex64",
        inputs=(x, w),
    )


def study(ctx: Context, case: Case) -> dict[str, Any]:
    x, w = case.inputs
    a = x.real.contiguous().detach()
    c = w.real.contiguous().detach()
    t_real = ctx.median_ns(lambda: kernels.real_control(a, c))
    t_complex = ctx.median_ns(case.baseline.fn)
    t_gauss = ctx.median_ns(case.variants[0].fn)
    r = t_complex / t_real
    return {
        "t_real_ns": t_real,
        "t_complex_ns": t_complex,
        "t_gauss_ns": t_gauss,
        "R": r,
        "gauss_over_real": t_gauss / t_real,
        "gauss_can_win": r > 3.0,
        "predicted_gauss_speedup": min(4.0 / 3.0, r / 3.0),
        "note": "Gauss costs about 3 real GEMMs; it beats native complex only when R > 3",
    }


EXPERIMENTS = {
    "contraction": Experiment(
        build=build, memory_bytes=reference.memory_bytes, study=study, default_repeats=30
    ),
}

if __name__ == "__main__":
    main(EXPERIMENTS)
