"""Roofline figures: achieved GFLOP/s and GB/s against the device peak.

GPU peaks come from a small table of data-sheet figures (dense, no sparsity). On the CPU there
is no trustworthy data sheet for a VM, so the peak is what the same library reaches on a
measured GEMM (compute) and a large copy (memory) at the same thread count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autopilot_harness.timing import Timer, median_time_ns

# Data-sheet peaks: TFLOP/s by dtype (tensor-core dense for 16-bit and tf32), memory TB/s.
KNOWN_DEVICES: dict[str, dict[str, Any]] = {
    "H200": {
        "tflops": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4},
        "tbps": 4.8,
    },
    "H100": {
        "tflops": {"float32": 67.0, "tf32": 494.7, "bfloat16": 989.4, "float16": 989.4},
        "tbps": 3.35,
    },
    "A100": {
        "tflops": {"float32": 19.5, "tf32": 156.0, "bfloat16": 312.0, "float16": 312.0},
        "tbps": 2.039,
    },
    "L40S": {
        "tflops": {"float32": 91.6, "tf32": 183.0, "bfloat16": 362.0, "float16": 362.0},
        "tbps": 0.864,
    },
}


def known_peak(device_name: str, dtype: str) -> dict[str, Any] | None:
    upper = device_name.upper()
    for key, figures in KNOWN_DEVICES.items():
        if key in upper:
            # complex64 GEMM runs on float32 units; tf32 is opt-in, so float32 is the honest peak
            real = {"complex64": "float32", "complex32": "float16"}.get(dtype, dtype)
            tflops = figures["tflops"].get(real, figures["tflops"]["float32"])
            return {
                "source": f"data sheet {key}",
                "gflops": tflops * 1e3,
                "gbps": figures["tbps"] * 1e3,
            }
    return None


def cpu_probe(timer: Timer, *, n: int = 384, copy_mib: int = 64) -> dict[str, Any]:
    """Peak of the same library on this CPU: a float32 GEMM and a large tensor copy."""
    from autopilot_harness._torch import require_torch

    torch = require_torch()
    a = torch.randn(n, n)
    b = torch.randn(n, n)
    c = torch.empty(n, n)
    src = torch.empty(copy_mib * 1024 * 1024 // 4)
    dst = torch.empty_like(src)

    def gemm() -> None:
        torch.mm(a, b, out=c)

    def copy() -> None:
        dst.copy_(src)

    gemm()
    copy()
    gemm_ns = min(timer.time_ns(gemm) for _ in range(5))
    copy_ns = min(timer.time_ns(copy) for _ in range(3))
    return {
        "source": f"measured: torch.mm {n}x{n} float32 and a {copy_mib} MiB copy, "
        f"{torch.get_num_threads()} threads",
        "gflops": 2.0 * n**3 / gemm_ns,
        "gbps": 2.0 * src.numel() * 4 / copy_ns,
    }


def achieved(
    time_ns: float, flops: float | None, bytes_moved: float | None, peak: dict[str, Any] | None
) -> dict[str, Any]:
    gflops = flops / time_ns if flops else None
    gbps = bytes_moved / time_ns if bytes_moved else None
    return {
        "time_ns": time_ns,
        "flops": flops,
        "bytes": bytes_moved,
        "gflops": gflops,
        "gbps": gbps,
        "fraction_of_peak_flops": gflops / peak["gflops"] if gflops and peak else None,
        "fraction_of_peak_bandwidth": gbps / peak["gbps"] if gbps and peak else None,
        "arithmetic_intensity": flops / bytes_moved if flops and bytes_moved else None,
    }


def thread_sweep(
    calls: dict[str, Callable[[], Any]], timer: Timer, *, per_point: int = 5
) -> dict[str, Any]:
    """Throughput at 1, 2, 4, ... threads up to the current count, per variant.

    Throughput that stays flat as threads are added says the time goes to a schedule (serial
    Python, launches, a single-threaded kernel), not to arithmetic.
    """
    from autopilot_harness._torch import require_torch

    torch = require_torch()
    original = torch.get_num_threads()
    counts = sorted({1, original} | {2**k for k in range(1, 8) if 2**k < original})
    points: dict[str, list[dict[str, float]]] = {name: [] for name in calls}
    try:
        for threads in counts:
            torch.set_num_threads(threads)
            for name, fn in calls.items():
                fn()
                ns = median_time_ns(fn, timer, per_point)
                points[name].append({"threads": threads, "time_ns": ns, "calls_per_s": 1e9 / ns})
    finally:
        torch.set_num_threads(original)
    flat = {}
    for name, pts in points.items():
        rates = [p["calls_per_s"] for p in pts]
        flat[name] = len(rates) > 1 and max(rates) < 1.2 * rates[0]
    return {"threads": counts, "points": points, "flat": flat}
