"""A product of a few tokens by a dense weight, each program holding a [BN, K] slice of the weight
in registers: one load of the whole slice, no shared-memory pipeline and no tensor cores, so every
program's bytes are in flight at once and the launch streams its weights from its first
instruction (`bench/results/linear_notes.md`).

    x [T, K] (rows contiguous)   weight [R, K] (contiguous)   y [T, R]
    grid: ceil(R / BN) programs; y[t, r] = sum_c x[t, c] · W[r, c] in fp32, rounded to y's dtype

With CONV = C > 0 (the GDN input projection, one sequence of T ≤ 2 tokens) the leading C channels
also pass through the layer's causal depthwise conv of 4 taps and the SiLU, in the program that
made them (`gdn/tiles.conv_silu_taps`, the conv kernel's arithmetic): y[t, c] for c < C is
silu(conv) of the rounded products, whose raw values go to x_out [T, C] (the round buffer the
commit advances the window from). The window state [C, 3] and the conv weights [C, 4] are read
before the PDL wait: no kernel of the pass writes them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels.gdn.tiles import conv_silu_taps
from hybridspec.kernels.pdl import wait_then_release

CONV_TAPS = 4  # the conv width the epilogue serves (every Qwen3.5 / 3.6 / Next GDN layer)


@triton.jit
def _rows_linear_kernel(x_ptr, w_ptr, y_ptr, s_ptr, cw_ptr, xo_ptr, R, stride_x, stride_y, stride_sc, stride_sk,
                        stride_cwc, stride_cwk, stride_xo, T: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
                        BN: tl.constexpr, CONV: tl.constexpr, USE_GDC: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    o_c = tl.arange(0, KP)
    n_ok, c_ok = o_n < R, o_c < K
    if CONV > 0:  # [BN] each: the window's three inputs before the call, oldest first, and the four taps
        v_ok = n_ok & (o_n < CONV)
        p_s = s_ptr + o_n * stride_sc
        b_s0 = tl.load(p_s, mask=v_ok, other=0.0)
        b_s1 = tl.load(p_s + stride_sk, mask=v_ok, other=0.0)
        b_s2 = tl.load(p_s + 2 * stride_sk, mask=v_ok, other=0.0)
        p_cw = cw_ptr + o_n * stride_cwc
        b_c0 = tl.load(p_cw, mask=v_ok, other=0.0).to(tl.float32)
        b_c1 = tl.load(p_cw + stride_cwk, mask=v_ok, other=0.0).to(tl.float32)
        b_c2 = tl.load(p_cw + 2 * stride_cwk, mask=v_ok, other=0.0).to(tl.float32)
        b_c3 = tl.load(p_cw + 3 * stride_cwk, mask=v_ok, other=0.0).to(tl.float32)
    if USE_GDC:
        wait_then_release()
    b_w = tl.load(w_ptr + o_n[:, None].to(tl.int64) * K + o_c[None, :], mask=n_ok[:, None] & c_ok[None, :],
                  other=0.0)  # [BN, KP]
    for t in tl.static_range(T):
        b_x = tl.load(x_ptr + t * stride_x + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [KP]
        b_y = tl.sum(b_w.to(tl.float32) * b_x[None, :], 1).to(y_ptr.dtype.element_ty)  # [BN]
        if CONV > 0:
            tl.store(xo_ptr + t * stride_xo + o_n, b_y, mask=v_ok)
            if t == 0:
                b_r0 = b_y
                b_v = conv_silu_taps(b_s0, b_s1, b_s2, b_r0, b_c0, b_c1, b_c2, b_c3)
            else:
                b_v = conv_silu_taps(b_s1, b_s2, b_r0, b_y, b_c0, b_c1, b_c2, b_c3)
            b_y = tl.where(v_ok, b_v, b_y)
        tl.store(y_ptr + t * stride_y + o_n, b_y, mask=n_ok)


def launch_rows_linear(x, weight, y, block_n: int, warps: int, options: dict, conv=None) -> None:
    """x [T, K], weight [R, K], y [T, R] (written), each contiguous in its last dimension and the
    weight's rows K apart; block_n rows of the weight per program. conv: None, or (state [C, 3],
    conv weight [C, 1, 4], x_out [T, C]) for the conv epilogue of the leading C ≤ R channels
    (T ≤ 2; x_out's and the state's channels one element apart)."""
    t, k = x.shape
    if weight.shape[1] != k or weight.stride() != (k, 1) or x.stride(-1) != 1 or y.stride(-1) != 1:
        raise ValueError(f"launch_rows_linear: x {tuple(x.shape)} strides {x.stride()}, weight "
                         f"{tuple(weight.shape)} strides {weight.stride()}, y strides {y.stride()}: rows must be "
                         "contiguous and the weight's K apart")
    channels, state, conv_weight, x_out = 0, y, y, y  # the conv's pointers unused without it
    if conv is not None:
        state, conv_weight, x_out = conv
        channels = conv_weight.shape[0]
        if (t > 2 or channels > weight.shape[0] or state.shape != (channels, CONV_TAPS - 1)
                or conv_weight.shape != (channels, 1, CONV_TAPS) or x_out.shape != (t, channels)
                or x_out.stride(-1) != 1 or state.dtype != y.dtype or x_out.dtype != y.dtype):
            raise ValueError(f"launch_rows_linear: conv state {tuple(state.shape)}, weight {tuple(conv_weight.shape)}, "
                             f"x_out {tuple(x_out.shape)} strides {x_out.stride()} do not fit {t} tokens of "
                             f"{weight.shape[0]} channels (T <= 2, [C, {CONV_TAPS - 1}], [C, 1, {CONV_TAPS}], [T, C])")
    _rows_linear_kernel[(triton.cdiv(weight.shape[0], block_n),)](
        x, weight, y, state, conv_weight, x_out, weight.shape[0], x.stride(0), y.stride(0),
        state.stride(0), state.stride(-1), conv_weight.stride(0), conv_weight.stride(-1), x_out.stride(0),
        T=t, K=k, KP=triton.next_power_of_2(k), BN=block_n, CONV=channels, num_warps=warps, **options)
