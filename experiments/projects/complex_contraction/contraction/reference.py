"""The trusted answer and the shapes' costs: complex128 einsum on the same inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

EQUATION = "bix,iox->box"  # batch, in-channel, out-channel, mode
# Bound when this module loads (before the kernels, see bench.py): replacing `torch.einsum`
# or `torch.randn` later does not change the trusted answer or the inputs.
_einsum = torch.einsum
_randn = torch.randn


def make_inputs(
    params: Mapping[str, Any], device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    b, c, m = params["batch"], params["channels"], params["modes"]
    x = _randn(b, c, m, dtype=torch.complex64, generator=gen)
    w = _randn(c, c, m, dtype=torch.complex64, generator=gen) / c**0.5
    return x.to(device), w.to(device)


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return _einsum(EQUATION, x.to(torch.complex128), w.to(torch.complex128))


def complex_macs(params: Mapping[str, Any]) -> int:
    return params["batch"] * params["channels"] ** 2 * params["modes"]


def io_bytes(params: Mapping[str, Any]) -> int:
    b, c, m = params["batch"], params["channels"], params["modes"]
    return 8 * (b * c * m * 2 + c * c * m)  # complex64 in, weights, out


def memory_bytes(params: Mapping[str, Any]) -> float:
    # inputs and output in complex64, reference in complex128, Gauss temporaries: ~6x the I/O
    return 6.0 * io_bytes(params)
