"""Argument checks and row views shared by the RMS norm launchers."""

from __future__ import annotations

from torch import Tensor

from hybridspec.kernels.interpreter import check_device

MAX_N = 16384


def rows_of(name: str, t: Tensor, n: int) -> Tensor:
    """[..., n] as [rows, n] (a view where the leading dimensions merge), contiguous in n."""
    if t.shape[-1] != n:
        raise ValueError(f"rms norm: {name} has last dimension {t.shape[-1]}, expected {n}")
    rows = t.reshape(-1, n)
    if rows.stride(-1) != 1:
        raise ValueError(f"rms norm: {name} must be contiguous in its last dimension (stride {t.stride()})")
    return rows


def check_norm_args(x: Tensor, weight: Tensor) -> int:
    """The row width n of a norm of x [..., n] with weight [n]; ValueError naming what is wrong."""
    n = weight.shape[0]
    if weight.dim() != 1 or x.shape[-1] != n:
        raise ValueError(f"rms norm: weight {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if n > MAX_N:
        raise ValueError(f"rms norm: rows of {n} elements (at most {MAX_N})")
    if weight.stride(0) != 1:
        raise ValueError(f"rms norm: weight must be contiguous (stride {weight.stride()})")
    check_device("rms norm", x=x, weight=weight)
    return n


def heads_of(name: str, t: Tensor, heads: int, n: int) -> Tensor:
    """[..., heads, n] as [tokens, heads, n] without a copy where the leading dimensions merge (a
    head's slice of a fused projection output does); a copy otherwise."""
    rows = t.reshape(-1, heads, n)
    if rows.stride(-1) != 1:
        raise ValueError(f"rms norm: {name} must be contiguous in its last dimension (stride {t.stride()})")
    return rows
