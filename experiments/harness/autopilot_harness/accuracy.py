"""Accuracy gate: a variant's output against the reference, relative to the output's magnitude.

Reassociated computations ((XB)A against X(BA), Gauss against the 4-multiply product) differ
by rounding that grows with the operands, so an absolute tolerance either flakes on large
operands or waves wrong answers through on small ones. The criterion is norm-wise:

    max |out - ref|  <=  rtol * max |ref|  +  atol

evaluated in float64 (complex128), with any non-finite value or shape mismatch failing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autopilot_harness.protocol import Tolerance


@dataclass(frozen=True)
class Accuracy:
    max_abs_error: float
    max_rel_error: float
    scale: float
    tolerance: Tolerance
    passed: bool
    reason: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_abs_error": _finite_or_none(self.max_abs_error),
            "max_rel_error": _finite_or_none(self.max_rel_error),
            "scale": _finite_or_none(self.scale),
            "tolerance": self.tolerance.as_dict(),
            "pass": self.passed,
            "reason": self.reason,
        }


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor, on whatever device
        value = value.detach().cpu()
        if value.is_complex():
            return value.to(dtype=_torch_complex128(value)).numpy()
        return value.double().numpy()
    arr = np.asarray(value)
    return arr.astype(np.complex128 if np.iscomplexobj(arr) else np.float64)


def _torch_complex128(value: Any) -> Any:
    import torch

    return torch.complex128


def check(output: Any, reference: Any, tolerance: Tolerance) -> Accuracy:
    out = _as_numpy(output)
    ref = _as_numpy(reference)
    if out.shape != ref.shape:
        return Accuracy(
            math.inf,
            math.inf,
            math.nan,
            tolerance,
            False,
            f"shape {out.shape} differs from the reference's {ref.shape}",
        )
    if not np.all(np.isfinite(ref)):
        return Accuracy(
            math.inf, math.inf, math.nan, tolerance, False, "the reference has non-finite values"
        )
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    if not np.all(np.isfinite(out)):
        return Accuracy(
            math.inf, math.inf, scale, tolerance, False, "the output has non-finite values"
        )
    err = float(np.max(np.abs(out - ref))) if out.size else 0.0
    rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
    bound = tolerance.rtol * scale + tolerance.atol
    passed = err <= bound
    reason = None if passed else f"max |error| {err:.3g} exceeds rtol*scale + atol = {bound:.3g}"
    return Accuracy(err, rel, scale, tolerance, passed, reason)
