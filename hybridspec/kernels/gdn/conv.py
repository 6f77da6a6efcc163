"""The GDN layer's causal depthwise convolution and SiLU in one launch (`reference.causal_conv_silu`'s
signature), instead of the copy, concatenation, convolution, SiLU and transpose kernels of its
PyTorch form.

Grid (B, channel blocks, token blocks): each program reads its tokens' K taps of each channel from
the conv state (taps before the first token) or from x, sums them in tap order in fp32, rounds to
the activation dtype, applies the SiLU and stores [BT, BC] of the contiguous output; the program
also copies its tile of x into `x_out` when given.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.gdn.tiles import conv_silu_tile
from hybridspec.kernels.interpreter import check_device
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _conv_silu_kernel(x_ptr, s_ptr, w_ptr, y_ptr, xo_ptr, T, C,
                      stride_xb, stride_xt, stride_sb, stride_sc, stride_sk, stride_wc, stride_wk,
                      stride_yb, stride_yt, stride_ob, stride_ot,
                      K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, COPY: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_b, i_c, i_t = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    t_ok, c_ok = o_t < T, o_c < C
    y, b_x = conv_silu_tile(x_ptr + i_b * stride_xb, s_ptr + i_b * stride_sb, w_ptr, o_t, o_c, t_ok, c_ok,
                            stride_xt, stride_sc, stride_sk, stride_wc, stride_wk, K)
    if COPY:  # the last tap read x at the program's own tokens
        tl.store(xo_ptr + i_b * stride_ob + o_t[:, None] * stride_ot + o_c[None, :], b_x,
                 mask=t_ok[:, None] & c_ok[None, :])
    tl.store(y_ptr + i_b * stride_yb + o_t[:, None] * stride_yt + o_c[None, :], y.to(y_ptr.dtype.element_ty),
             mask=t_ok[:, None] & c_ok[None, :])


def causal_conv_silu(x: Tensor, state: Tensor, weight: Tensor, *, x_out: Tensor | None = None) -> Tensor:
    """`reference.causal_conv_silu` in one launch. x [B, T, C] and x_out need unit channel stride."""
    B, T, C = x.shape
    K = weight.shape[-1]
    if state.shape != (B, C, K - 1) or weight.shape != (C, 1, K):
        raise ValueError(f"causal conv: state {tuple(state.shape)} and weight {tuple(weight.shape)} do not fit "
                         f"x {tuple(x.shape)} (expected [{B}, {C}, {K - 1}] and [{C}, 1, {K}])")
    if x.stride(-1) != 1 or (x_out is not None and (x_out.shape != x.shape or x_out.stride(-1) != 1)):
        raise ValueError("causal conv: x and x_out must be [B, T, C] with unit channel stride")
    check_device("causal conv", x=x, state=state, weight=weight, x_out=x_out)
    if not (x.dtype == state.dtype == weight.dtype) or (x_out is not None and x_out.dtype != x.dtype):
        raise ValueError(f"causal conv: x {x.dtype}, state {state.dtype}, weight {weight.dtype} and x_out must share "
                         "a dtype")
    y = torch.empty((B, T, C), dtype=x.dtype, device=x.device)
    bt = min(16, triton.next_power_of_2(max(T, 1)))
    bc = 128
    xo = x_out if x_out is not None else y
    _conv_silu_kernel[(B, triton.cdiv(C, bc), triton.cdiv(T, bt))](
        x, state, weight, y, xo, T, C, x.stride(0), x.stride(1), state.stride(0), state.stride(1), state.stride(2),
        weight.stride(0), weight.stride(2), y.stride(0), y.stride(1), xo.stride(0), xo.stride(1),
        K=K, BT=bt, BC=bc, COPY=x_out is not None, num_warps=4, **pdl.options(x))
    return y
