"""The one-launch router for calls of a few tokens, each program holding whole rows of the router
weight in registers (the form of `kernels/linear/rows.py`: one load of its slice, every program's
bytes in flight at once).

Grid ceil(E / BE): program p loads the rows of experts p·BE … p·BE + BE − 1 over the whole hidden
dimension and stores every token's logits for them (fp32 sums) into part [N, E]; then it arrives
at the counter, and the program that arrives last rounds the logits to x's dtype, stores them and
runs softmax and top-k for every token (`tiles.route_partials`, one span), and resets the counter.
Under programmatic dependent launch the rows are loaded before the wait (no kernel writes weights,
`kernels/pdl.py`), while the previous kernel runs (the post-attention norm; with NORM, the
mixer's out-projection).

    x [N, H]   weight [E, H]   part [N, E] fp32   logits [N, E]   ids / weights [N, k]

With NORM the logits are taken from the offset RMS norm h of s = x (+ residual), which every program
forms itself from the rows (`norm/math.py`: the norm kernel's arithmetic), so the MoE's input norm
needs no launch of its own: the launch has one wave, so the norm's prologue is paid once, not once
per wave. Program 0 stores h (the experts' input) and s (the residual stream).

    residual [N, H]   norm weight [H]   h, s [N, H] (written)
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.tiles import route_partials
from hybridspec.kernels.norm.math import offset_rms, residual_sum
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import last_to_arrive


@triton.jit
def _router_rows_kernel(x_ptr, r_ptr, part_ptr, counter_ptr, logits_ptr, ids_ptr, w_ptr, res_ptr, nw_ptr, h_ptr,
                        s_ptr, stride_xn, stride_re, stride_res, stride_h, stride_s, eps, E, N: tl.constexpr,
                        H: tl.constexpr, HP: tl.constexpr, K: tl.constexpr, RENORMALIZE: tl.constexpr,
                        BE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, TAIL_M: tl.constexpr,
                        PACKED: tl.constexpr, NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, USE_GDC: tl.constexpr):
    o_e = tl.program_id(0) * BE + tl.arange(0, BE)
    o_c = tl.arange(0, HP)
    e_ok, c_ok = o_e < E, o_c < H
    b_r = tl.load(r_ptr + o_e[:, None] * stride_re + o_c[None, :], mask=e_ok[:, None] & c_ok[None, :],
                  other=0.0)  # [BE, HP], before the wait
    if NORM:
        b_nw = tl.load(nw_ptr + o_c, mask=c_ok, other=0.0)  # [HP], before the wait
    if USE_GDC:
        wait_then_release()
    for m in tl.static_range(N):
        b_x = tl.load(x_ptr + m * stride_xn + o_c, mask=c_ok, other=0.0)  # [HP]
        if NORM:
            if HAS_RESIDUAL:
                b_x = residual_sum(b_x, tl.load(res_ptr + m * stride_res + o_c, mask=c_ok, other=0.0),
                                   s_ptr.dtype.element_ty)
                if tl.program_id(0) == 0:
                    tl.store(s_ptr + m * stride_s + o_c, b_x, mask=c_ok)
            b_x = offset_rms(b_x, b_nw, H, eps, h_ptr.dtype.element_ty)
            if tl.program_id(0) == 0:
                tl.store(h_ptr + m * stride_h + o_c, b_x, mask=c_ok)
        tl.store(part_ptr + m * E + o_e, tl.sum(b_r.to(tl.float32) * b_x.to(tl.float32)[None, :], 1), mask=e_ok)
    if last_to_arrive(counter_ptr, tl.num_programs(0)):  # the last program: softmax and top-k of every token
        route_partials(part_ptr, logits_ptr, ids_ptr, w_ptr, N, E, 1, K, RENORMALIZE, BLOCK_E, BLOCK_K, TAIL_M,
                       PACKED)
        tl.atomic_xchg(counter_ptr, 0)  # every program has arrived: ready for the next call


def launch_router_rows(x, weight, part, counter, logits, ids, weights, top_k: int, renormalize: bool,
                       block_e: int, warps: int, packed_rows: int, norm=None) -> None:
    """x [N, H], weight [E, H] (rows contiguous), part [N, E] fp32 scratch, counter (int32, zero; left
    zero), logits [N, E] (x's dtype), ids [N, k] long, weights [N, k] (all written); the argmax rounds
    on packed keys when N ≤ packed_rows (`tiles.softmax_top_k`). norm: None, or (norm weight [H], eps,
    residual [N, H] or None, h [N, H] written, s [N, H] written where there is a residual), rows
    contiguous, x's dtype."""
    n, h = x.shape
    e = weight.shape[0]
    tail = triton.next_power_of_2(n)
    if norm is None:
        norm_weight, eps, residual, h_out, s_out = x, 0.0, x, x, x  # the norm's pointers unused without it
    else:
        norm_weight, eps, residual, h_out, s_out = norm
        if norm_weight.shape != (h,) or h_out.shape != x.shape or (residual is not None and residual.shape != x.shape):
            raise ValueError(f"launch_router_rows: norm weight {tuple(norm_weight.shape)}, h {tuple(h_out.shape)} "
                             f"and residual do not fit x {tuple(x.shape)}")
    res = x if residual is None else residual
    _router_rows_kernel[(triton.cdiv(e, block_e),)](
        x, weight, part, counter, logits, ids, weights, res, norm_weight, h_out, s_out, x.stride(0),
        weight.stride(0), res.stride(0), h_out.stride(0), s_out.stride(0), eps, e, N=n, H=h,
        HP=triton.next_power_of_2(h), K=top_k, RENORMALIZE=renormalize, BE=block_e,
        BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k), TAIL_M=tail,
        PACKED=tail <= packed_rows, NORM=norm is not None, HAS_RESIDUAL=residual is not None,
        num_warps=warps, **pdl.options(x))
