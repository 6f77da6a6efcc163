"""The GDN out-projection of a few tokens with the layer's gated output norm applied to its input
by every program (`rows.py`'s register-slice form; the norm's roundings from `norm/math.py`), so the
norm needs no launch of its own.

    o [T, HV, D] (any float dtype)   z [T, HV, D] (the gate, rows of heads contiguous)   norm weight [D]
    weight [R, HV·D] (contiguous)    y [T, R] = (weight_n · normalize(o) · silu(z)) W^T in z's dtype
    grid: ceil(R / BN) programs, each holding [BN, HV, D] of the weight in registers
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels.norm.math import gated_rms
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _rows_gated_linear_kernel(o_ptr, z_ptr, nw_ptr, w_ptr, y_ptr, R, stride_ot, stride_oh, stride_zt, stride_zh,
                              stride_y, eps, T: tl.constexpr, HV: tl.constexpr, HVP: tl.constexpr,
                              D: tl.constexpr, DP: tl.constexpr, BN: tl.constexpr, USE_GDC: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_h, o_d = tl.arange(0, HVP), tl.arange(0, DP)
    n_ok = o_n < R
    hd_ok = (o_h < HV)[:, None] & (o_d < D)[None, :]  # [HVP, DP]
    if USE_GDC:
        wait_then_release()
    p_w = w_ptr + o_n[:, None, None].to(tl.int64) * (HV * D) + (o_h[:, None] * D + o_d[None, :])[None, :, :]
    b_w = tl.load(p_w, mask=n_ok[:, None, None] & hd_ok[None, :, :], other=0.0)  # [BN, HVP, DP]
    b_nw = tl.load(nw_ptr + o_d, mask=o_d < D, other=0.0)  # [DP]
    for t in tl.static_range(T):
        b_o = tl.load(o_ptr + t * stride_ot + o_h[:, None] * stride_oh + o_d[None, :], mask=hd_ok, other=0.0)
        b_z = tl.load(z_ptr + t * stride_zt + o_h[:, None] * stride_zh + o_d[None, :], mask=hd_ok, other=0.0)
        b_x = gated_rms(b_o, b_z, b_nw[None, :], D, eps, y_ptr.dtype.element_ty).to(tl.float32)  # [HVP, DP]
        b_y = tl.sum(tl.sum(b_w.to(tl.float32) * b_x[None, :, :], 2), 1)  # [BN]
        tl.store(y_ptr + t * stride_y + o_n, b_y.to(y_ptr.dtype.element_ty), mask=n_ok)


def launch_rows_gated_linear(o, z, norm_weight, eps: float, weight, y, block_n: int, warps: int,
                             options: dict) -> None:
    """o, z [T, HV, D] (each contiguous in D), norm_weight [D], weight [R, HV·D] contiguous, y [T, R]
    (written, rows contiguous, z's dtype); block_n rows of the weight per program."""
    t, hv, d = z.shape
    if (o.shape != z.shape or norm_weight.shape != (d,) or weight.dim() != 2 or weight.shape[1] != hv * d
            or not weight.is_contiguous() or o.stride(-1) != 1 or z.stride(-1) != 1 or y.stride(-1) != 1
            or tuple(y.shape) != (t, weight.shape[0])):
        raise ValueError(f"launch_rows_gated_linear: o {tuple(o.shape)} strides {o.stride()}, z {tuple(z.shape)} "
                         f"strides {z.stride()}, norm weight {tuple(norm_weight.shape)}, weight "
                         f"{tuple(weight.shape)}, y {tuple(y.shape)}: o and z [T, HV, D] contiguous in D, the "
                         "weight contiguous [R, HV·D]")
    _rows_gated_linear_kernel[(triton.cdiv(weight.shape[0], block_n),)](
        o, z, norm_weight, weight, y, weight.shape[0], o.stride(0), o.stride(1), z.stride(0), z.stride(1), y.stride(0),
        eps, T=t, HV=hv, HVP=triton.next_power_of_2(hv), D=d, DP=triton.next_power_of_2(d), BN=block_n,
        num_warps=warps, **options)
