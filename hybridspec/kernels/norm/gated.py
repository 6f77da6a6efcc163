"""Triton gated RMS norm (the GDN output norm): `reference.gated_rms_norm`'s signature and
roundings, one launch, one program per (token, head) row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.norm.checks import check_norm_args, heads_of
from hybridspec.kernels.pdl import wait_then_release


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


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """As `reference.gated_rms_norm`: weight · normalize(x) · silu(gate) in gate's dtype. x and gate
    [..., heads, n] may be strided views (each token's heads at its own stride)."""
    n = check_norm_args(x, weight)
    if gate.shape != x.shape:
        raise ValueError(f"rms norm: gate {tuple(gate.shape)} does not match x {tuple(x.shape)}")
    if weight.dtype != gate.dtype:  # w · x̂ is rounded to gate's dtype, as the reference rounds it for such a w
        raise ValueError(f"rms norm: weight dtype {weight.dtype} differs from gate's {gate.dtype}")
    heads = x.shape[-2] if x.dim() >= 2 else 1
    xs, gs = heads_of("x", x, heads, n), heads_of("gate", gate, heads, n)
    y = torch.empty(x.shape, dtype=gate.dtype, device=x.device)
    if xs.numel():
        _gated_rms_norm_kernel[(xs.shape[0] * heads,)](xs, gs, weight, y, xs.stride(0), xs.stride(1), gs.stride(0),
                                                       gs.stride(1), heads, n, eps, BLOCK=triton.next_power_of_2(n),
                                                       **pdl.options(gate))
    return y
