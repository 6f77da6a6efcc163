"""A product of a few tokens by a dense weight, each program holding a [BN, K] slice of the weight
in registers: one load of the whole slice, no shared-memory pipeline and no tensor cores, so every
program's bytes are in flight at once and the launch streams its weights from its first
instruction (`bench/results/linear_notes.md`).

    x [T, K] (rows contiguous)   weight [R, K] (contiguous)   y [T, R]
    grid: ceil(R / BN) programs; y[t, r] = sum_c x[t, c] · W[r, c] in fp32, rounded to y's dtype

With NORM the product's input is the offset RMS norm of s = x (+ residual) instead of x, which every
program forms itself from the rows (`norm/math.py`: the norm kernel's roundings), so the norm needs
no launch of its own; program 0 stores s (the residual stream the next norm adds to).

    residual [T, K]   norm weight [K]   s [T, K] (written by program 0 when there is a residual)
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels.norm.math import offset_rms, residual_sum
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _rows_linear_kernel(x_ptr, w_ptr, y_ptr, r_ptr, nw_ptr, s_ptr, R, stride_x, stride_y, stride_r, stride_s, eps,
                        T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BN: tl.constexpr, NORM: tl.constexpr,
                        HAS_RESIDUAL: tl.constexpr, USE_GDC: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_c = tl.arange(0, KP)
    n_ok, c_ok = o_n < R, o_c < K
    if USE_GDC:
        wait_then_release()
    b_w = tl.load(w_ptr + o_n[:, None].to(tl.int64) * K + o_c[None, :], mask=n_ok[:, None] & c_ok[None, :],
                  other=0.0)  # [BN, KP]
    if NORM:
        b_nw = tl.load(nw_ptr + o_c, mask=c_ok, other=0.0)  # [KP]
    for t in tl.static_range(T):
        b_x = tl.load(x_ptr + t * stride_x + o_c, mask=c_ok, other=0.0)  # [KP]
        if NORM:
            if HAS_RESIDUAL:
                b_x = residual_sum(b_x, tl.load(r_ptr + t * stride_r + o_c, mask=c_ok, other=0.0),
                                   s_ptr.dtype.element_ty)
                if tl.program_id(0) == 0:
                    tl.store(s_ptr + t * stride_s + o_c, b_x, mask=c_ok)
            b_x = offset_rms(b_x, b_nw, K, eps, y_ptr.dtype.element_ty)
        b_y = tl.sum(b_w.to(tl.float32) * b_x.to(tl.float32)[None, :], 1)  # [BN]
        tl.store(y_ptr + t * stride_y + o_n, b_y.to(y_ptr.dtype.element_ty), mask=n_ok)


def launch_rows_linear(x, weight, y, block_n: int, warps: int, options: dict, norm=None) -> None:
    """x [T, K], weight [R, K], y [T, R] (written), each contiguous in its last dimension and the
    weight's rows K apart; block_n rows of the weight per program. norm: None, or (norm weight [K],
    eps, residual [T, K] or None, s [T, K] written where there is a residual), rows contiguous."""
    t, k = x.shape
    if weight.shape[1] != k or weight.stride() != (k, 1) or x.stride(-1) != 1 or y.stride(-1) != 1:
        raise ValueError(f"launch_rows_linear: x {tuple(x.shape)} strides {x.stride()}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}, y strides {y.stride()}: rows must be "
                         "contiguous and the weight's K apart")
    nw, eps, residual, s = norm if norm is not None else (x, 0.0, None, None)
    r, s = (x, x) if residual is None else (residual, s)
    if norm is not None and (nw.shape != (k,) or r.shape != x.shape or s.shape != x.shape or r.stride(-1) != 1
                             or s.stride(-1) != 1 or nw.stride(-1) != 1):
        raise ValueError(f"launch_rows_linear: norm weight {tuple(nw.shape)}, residual {tuple(r.shape)} and s "
                         f"{tuple(s.shape)} must match x {tuple(x.shape)} with rows contiguous")
    _rows_linear_kernel[(triton.cdiv(weight.shape[0], block_n),)](
        x, weight, y, r, nw, s, weight.shape[0], x.stride(0), y.stride(0), r.stride(0), s.stride(0), eps, T=t, K=k,
        KP=triton.next_power_of_2(k), BN=block_n, NORM=norm is not None, HAS_RESIDUAL=residual is not None,
        num_warps=warps, **options)
