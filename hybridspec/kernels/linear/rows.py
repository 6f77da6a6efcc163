"""A product of a few tokens by a dense weight, each program holding a [BN, K] slice of the weight
in registers: one load of the whole slice, no shared-memory pipeline and no tensor cores, so every
program's bytes are in flight at once and the launch streams its weights from its PDL wait on
(`bench/results/linear_notes.md`).

    x [T, K] (rows contiguous)   weight [R, K] (contiguous)   y [T, R]
    grid: ceil(R / BN) programs; y[t, r] = sum_c x[t, c] · W[r, c] in fp32, rounded to y's dtype
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _rows_linear_kernel(x_ptr, w_ptr, y_ptr, R, stride_x, stride_y, T: tl.constexpr, K: tl.constexpr,
                        KP: tl.constexpr, BN: tl.constexpr, USE_GDC: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_c = tl.arange(0, KP)
    n_ok, c_ok = o_n < R, o_c < K
    if USE_GDC:
        wait_then_release()
    b_w = tl.load(w_ptr + o_n[:, None].to(tl.int64) * K + o_c[None, :], mask=n_ok[:, None] & c_ok[None, :],
                  other=0.0)  # [BN, KP]
    for t in tl.static_range(T):
        b_x = tl.load(x_ptr + t * stride_x + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [KP]
        b_y = tl.sum(b_w.to(tl.float32) * b_x[None, :], 1)  # [BN]
        tl.store(y_ptr + t * stride_y + o_n, b_y.to(y_ptr.dtype.element_ty), mask=n_ok)


def launch_rows_linear(x, weight, y, block_n: int, warps: int, options: dict) -> None:
    """x [T, K], weight [R, K], y [T, R] (written), each contiguous in its last dimension and the
    weight's rows K apart; block_n rows of the weight per program."""
    t, k = x.shape
    if weight.shape[1] != k or weight.stride() != (k, 1) or x.stride(-1) != 1 or y.stride(-1) != 1:
        raise ValueError(f"launch_rows_linear: x {tuple(x.shape)} strides {x.stride()}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}, y strides {y.stride()}: rows must be "
                         "contiguous and the weight's K apart")
    _rows_linear_kernel[(triton.cdiv(weight.shape[0], block_n),)](
        x, weight, y, weight.shape[0], x.stride(0), y.stride(0), T=t, K=k, KP=triton.next_power_of_2(k),
        BN=block_n, num_warps=warps, **options)
