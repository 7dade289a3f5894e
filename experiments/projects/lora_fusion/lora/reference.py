"""Inputs, the float64 reference and the shapes' costs for the multi-LoRA delta.

Token t uses adapter ids[t]; its delta is x_t B_i A_i with B_i: hidden x rank and
A_i: rank x hidden. Tokens are routed round-robin then shuffled, so every adapter has
tokens/adapters of them (serving batches are grouped by the router the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


class ShapeError(ValueError):
    pass


@dataclass
class Inputs:
    x: torch.Tensor  # tokens x hidden
    b: torch.Tensor  # adapters x hidden x rank
    a: torch.Tensor  # adapters x rank x hidden
    ids: torch.Tensor  # tokens: adapter of each token
    order: torch.Tensor  # tokens sorted by adapter (a permutation)


def make_inputs(
    params: Mapping[str, Any], device: str, seed: int, tokens: int | None = None
) -> Inputs:
    n = tokens if tokens is not None else params["tokens"]
    h, r, k = params["hidden"], params["rank"], params["adapters"]
    if n % k:
        raise ShapeError(f"tokens ({n}) must be a multiple of adapters ({k})")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(n, h, generator=gen)
    b = torch.randn(k, h, r, generator=gen) / h**0.5
    a = torch.randn(k, r, h, generator=gen) / r**0.5
    ids = torch.arange(n) % k
    ids = ids[torch.randperm(n, generator=gen)]
    order = torch.argsort(ids, stable=True)
    return Inputs(x.to(device), b.to(device), a.to(device), ids.to(device), order.to(device))


def reference(inp: Inputs) -> torch.Tensor:
    x, b, a = inp.x.double(), inp.b.double(), inp.a.double()
    w = torch.bmm(b, a)  # adapters x hidden x hidden
    return torch.einsum("th,tho->to", x, w[inp.ids])


def flops_xb_a(params: Mapping[str, Any]) -> float:
    return 2.0 * params["tokens"] * params["rank"] * 2 * params["hidden"]


def flops_x_ba(params: Mapping[str, Any]) -> float:
    h, r, k, n = params["hidden"], params["rank"], params["adapters"], params["tokens"]
    return 2.0 * (k * h * r * h + n * h * h)


def io_bytes(params: Mapping[str, Any]) -> float:
    h, r, k, n = params["hidden"], params["rank"], params["adapters"], params["tokens"]
    return 4.0 * (2 * n * h + 2 * k * h * r)


def memory_bytes(params: Mapping[str, Any]) -> float:
    h, k, n = params["hidden"], params["adapters"], params["tokens"]
    # float64 reference gathers one hidden x hidden matrix per token; X(BA) forms k of them
    return 8.0 * n * h * h + 3 * 4.0 * k * h * h + 4 * io_bytes(params)
