"""The implementations under study (the part a hypothesis may change).

Two levers: ``fuse`` (one batched matmul over adapter-grouped tokens instead of a Python loop
of per-adapter matmuls) and ``reassociate`` ((XB)A, two thin matmuls, against X(BA), one
hidden x hidden weight per adapter formed first).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lora.reference import Inputs


def unfused(inp: Inputs, reassociate: bool) -> torch.Tensor:
    out = torch.empty_like(inp.x)
    for i in range(inp.b.shape[0]):
        rows = inp.ids == i
        xi = inp.x[rows]
        if reassociate:
            out[rows] = xi @ (inp.b[i] @ inp.a[i])
        else:
            out[rows] = (xi @ inp.b[i]) @ inp.a[i]
    return out


def fused(inp: Inputs, reassociate: bool) -> torch.Tensor:
    k = inp.b.shape[0]
    grouped = inp.x[inp.order].view(k, -1, inp.x.shape[1])
    y = (
        torch.bmm(grouped, torch.bmm(inp.b, inp.a))
        if reassociate
        else torch.bmm(torch.bmm(grouped, inp.b), inp.a)
    )
    out = torch.empty_like(inp.x)
    out[inp.order] = y.reshape(-1, inp.x.shape[1])
    return out


def make(inp: Inputs, levers: frozenset[str]) -> Callable[[], torch.Tensor]:
    apply = fused if "fuse" in levers else unfused
    reassociate = "reassociate" in levers
    return lambda: apply(inp, reassociate)
