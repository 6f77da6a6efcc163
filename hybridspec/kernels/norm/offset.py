"""Triton RMS norms of one row per program, the residual add fused in, one launch: the offset norm
(Qwen3.5 / Qwen3-Next, `reference.offset_rms_norm`) and the plain norm (Qwen3, the DFlash drafter,
`reference.rms_norm`), each with its reference's signature and roundings."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.norm.checks import check_norm_args, rows_of
from hybridspec.kernels.norm.math import offset_rms, plain_rms, residual_sum
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, stride_x, stride_r, stride_y, stride_s, N, eps,
                     OFFSET: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < N
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0)
        x = residual_sum(x, r, s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + cols, x, mask=ok)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0)
    if OFFSET:
        y = offset_rms(x, w, N, eps, y_ptr.dtype.element_ty)
    else:
        y = plain_rms(x, w, N, eps, y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * stride_y + cols, y, mask=ok)


def offset_rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """As `reference.offset_rms_norm`: (normalize(s) · (1 + weight), s), s = x (+ residual)."""
    return _launch(x, weight, eps, residual, offset=True)


def rms_norm(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """As `reference.rms_norm`: (weight · normalize(s), s), s = x (+ residual); weight in x's dtype."""
    if weight.dtype != x.dtype:
        raise ValueError(f"rms norm: weight {weight.dtype} must have x's dtype {x.dtype}")
    return _launch(x, weight, eps, residual, offset=False)


def _launch(x: Tensor, weight: Tensor, eps: float, residual: Tensor | None, offset: bool) -> tuple[Tensor, Tensor]:
    n = check_norm_args(x, weight)
    rows = rows_of("x", x, n)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if residual is None:
        s, r_rows, s_rows = x, rows, rows
    else:
        if residual.shape != x.shape:
            raise ValueError(f"rms norm: residual {tuple(residual.shape)} does not match x {tuple(x.shape)}")
        r_rows = rows_of("residual", residual, n)
        s = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        s_rows = s.view(-1, n)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](
            rows, r_rows, weight, y, s_rows, rows.stride(0), r_rows.stride(0), n, s_rows.stride(0), n, eps,
            OFFSET=offset, HAS_RESIDUAL=residual is not None, BLOCK=triton.next_power_of_2(n), **pdl.options(x))
    return y, s
