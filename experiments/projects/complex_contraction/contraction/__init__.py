"""Batched complex contraction: native complex einsum against the 3-multiply Gauss form."""
