"""The implementations under study (the part a hypothesis may change).

With x = a + ib and w = c + id, the native product needs four real multiplies
(ac - bd, ad + bc); Gauss/Karatsuba needs three:
    k1 = c(a + b),  k2 = a(d - c),  k3 = b(c + d);  real = k1 - k3,  imag = k1 + k2.
"""

from __future__ import annotations

import torch

from contraction.reference import EQUATION


def native(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.einsum(EQUATION, x, w)


def gauss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    a, b = x.real, x.imag
    c, d = w.real, w.imag
    k1 = torch.einsum(EQUATION, a + b, c)
    k2 = torch.einsum(EQUATION, a, d - c)
    k3 = torch.einsum(EQUATION, b, c + d)
    return torch.complex(k1 - k3, k1 + k2)


def real_control(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The same contraction on real operands: one real GEMM of the same shape."""
    return torch.einsum(EQUATION, a, c)
