"""x Wᵀ for at most MAX_ROWS rows in one launch: program n computes output columns n·BN … n·BN+BN−1
for every row, over the K dimension in steps of BK (fp32 accumulation, bf16 tensor-core products,
IEEE fp32 products for fp32), and stores them in x's dtype. The weight is read once, split evenly
over N / BN programs; the reduction order over K is fixed, so a row's result does not depend on
the other rows of the call (batch invariance). Longer calls (prefill) take the library product."""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.moe.tiles import dot_bt

MAX_ROWS = 16
BN, BK, STAGES, WARPS = 16, 256, 4, 4


@triton.jit
def _linear_kernel(x_ptr, w_ptr, y_ptr, stride_xm, stride_wn, stride_ym, M, N, K: tl.constexpr,
                   BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PRECISION: tl.constexpr,
                   WIDEN: tl.constexpr):
    o_m = tl.arange(0, BM)
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_c = tl.arange(0, BK)
    m_ok, n_ok = o_m < M, o_n < N
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for c in range(0, K, BK):
        c_ok = c + o_c < K
        b_x = tl.load(x_ptr + o_m[:, None] * stride_xm + c + o_c[None, :], mask=m_ok[:, None] & c_ok[None, :],
                      other=0.0)  # [BM, BK]
        b_w = tl.load(w_ptr + o_n[:, None] * stride_wn + c + o_c[None, :], mask=n_ok[:, None] & c_ok[None, :],
                      other=0.0)  # [BN, BK]
        acc = dot_bt(b_x, b_w, acc, PRECISION, WIDEN)
    tl.store(y_ptr + o_m[:, None] * stride_ym + o_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=m_ok[:, None] & n_ok[None, :])


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """As `reference.linear`: x [M, K], weight [N, K] → [M, N] in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"linear: x must be [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.shape[0] > MAX_ROWS:
        return F.linear(x, weight)
    if x.stride(-1) != 1 or weight.stride(-1) != 1 or x.dtype != weight.dtype:
        raise ValueError(f"linear: x ({x.dtype}, strides {x.stride()}) and weight ({weight.dtype}, strides "
                         f"{weight.stride()}) must share a dtype and be contiguous in K")
    if x.device.type != "cuda" and not interpreted():
        raise ValueError(f"linear: tensors are on {x.device}; the Triton kernel needs CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        _linear_kernel[(triton.cdiv(n, BN),)](
            x, weight, y, x.stride(0), weight.stride(0), y.stride(0), m, n, K=k, BM=16, BN=BN,
            BK=min(BK, max(16, triton.next_power_of_2(k))), PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
            WIDEN=interpreted(), num_warps=WARPS, num_stages=STAGES)
    return y
