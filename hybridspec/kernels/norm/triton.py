"""Triton RMS norms: the signatures and roundings of `reference.py`, one launch per call, one
program per row (a row's sum of squares never depends on the other rows, so a token's result is
the same whatever the number of tokens in the call: batch invariance, which exactness relies on).
Rows must be contiguous in their last dimension; N ≤ 16384."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.pdl import wait_then_release

MAX_N = 16384


@triton.jit
def _gated_rms(x, g, w, N, eps, DTYPE: tl.constexpr):
    """weight · normalize(x) · silu(g) over one row x and its gate g (N values each; masked entries 0),
    rounded where `reference.gated_rms_norm` rounds for a weight w in DTYPE (as the loaders store
    it): x to DTYPE first, the normalized value and its product with w to DTYPE, the result to
    DTYPE."""
    xf = x.to(DTYPE).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (w.to(tl.float32) * (xf * inv).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    gf = g.to(tl.float32)
    return (y * (gf / (1.0 + tl.exp(-gf)))).to(DTYPE)


@triton.jit
def _offset_rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, stride_x, stride_r, stride_y, stride_s,
                            N, eps, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(s_ptr.dtype.element_ty)  # torch's add: fp32, rounded
        tl.store(s_ptr + row * stride_s + cols, x, mask=ok)
    xf = x.to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, (xf * inv * (1.0 + w)).to(y_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _gated_rms_norm_kernel(x_ptr, g_ptr, w_ptr, y_ptr, stride_xt, stride_xh, stride_gt, stride_gh, H, N, eps,
                           BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    row = tl.program_id(0).to(tl.int64)  # one (token, head) row; y is contiguous
    t, h = row // H, row % H
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + t * stride_xt + h * stride_xh + cols, mask=ok, other=0.0)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    g = tl.load(g_ptr + t * stride_gt + h * stride_gh + cols, mask=ok, other=0.0)
    tl.store(y_ptr + row * N + cols, _gated_rms(x, g, w, N, eps, y_ptr.dtype.element_ty), mask=ok)


def _rows(name: str, t: Tensor, n: int) -> Tensor:
    if t.shape[-1] != n:
        raise ValueError(f"rms norm: {name} has last dimension {t.shape[-1]}, expected {n}")
    rows = t.reshape(-1, n)
    if rows.stride(-1) != 1:
        raise ValueError(f"rms norm: {name} must be contiguous in its last dimension (stride {t.stride()})")
    return rows


def _check(x: Tensor, weight: Tensor) -> int:
    n = weight.shape[0]
    if weight.dim() != 1 or x.shape[-1] != n:
        raise ValueError(f"rms norm: weight {tuple(weight.shape)} does not match x {tuple(x.shape)}")
    if n > MAX_N:
        raise ValueError(f"rms norm: rows of {n} elements (at most {MAX_N})")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"rms norm: tensors are on {x.device}; the Triton kernels need CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
    return n


def offset_rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """As `reference.offset_rms_norm`: (normalize(s) · (1 + weight), s), s = x (+ residual)."""
    n = _check(x, weight)
    rows = _rows("x", x, n)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        s, r_rows, s_rows = x, rows, rows
    else:
        if residual.shape != x.shape:
            raise ValueError(f"rms norm: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
        r_rows = _rows("residual", residual, n)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s_rows = s.view(-1, n)
    if rows.shape[0]:
        _offset_rms_norm_kernel[(rows.shape[0],)](
            rows, r_rows, weight, y, s_rows, rows.stride(0), r_rows.stride(0), n, s_rows.stride(0), n, eps,
            HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n), **pdl.options(x))
    return y, s


def _heads(name: str, t: Tensor, heads: int, n: int) -> Tensor:
    """[..., heads, n] as [tokens, heads, n] without a copy where the leading dimensions merge (a
    head's slice of a fused projection output does); a copy otherwise."""
    rows = t.reshape(-1, heads, n)
    if rows.stride(-1) != 1:
        raise ValueError(f"rms norm: {name} must be contiguous in its last dimension (stride {t.stride()})")
    return rows


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As `reference.gated_rms_norm`: weight · normalize(x) · silu(gate) in gate's dtype. x and gate
    [..., heads, n] may be strided views (each token's heads at its own stride)."""
    n = _check(x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"rms norm: gate {tuple(gate.shape)} does not match x {tuple(x.shape)}")
    heads = x.shape[-2] if x.dim() >= 2 else 1
    xs, gs = _heads("x", x, heads, n), _heads("gate", gate, heads, n)
    y = torch.empty(x.shape, dtype=gate.dtype, device=x.device)
    if xs.numel():
        _gated_rms_norm_kernel[(xs.shape[0] * heads,)](xs, gs, weight, y, xs.stride(0), xs.stride(1), gs.stride(0),
                                                       gs.stride(1), heads, n, eps, BLOCK=triton.next_power_of_2(n),
                                                       **pdl.options(gate))
    return y
