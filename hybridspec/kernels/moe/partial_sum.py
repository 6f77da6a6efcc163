"""Each token's MoE output from the one-pass kernel's partial rows, summed in a fixed order:

    out[n, :] = sum_{j in 0..k} sum_t y[n, j, t, :]

over the rows that were written: j < k only where this call holds expert ids[n, j] (experts
[first, first + E) under expert parallelism), t < ceil(I / BN) for a routed expert and
t < ceil(Is / BN) for the shared expert (j = k, present when Is > 0). A token with no row stores
zeros. The order (j outer, the tiles as one fixed-shape reduction) does not depend on the order the
one-pass programs ran, so the result is the same in every run.

Grid (N, ceil(H / BH)).

    y [N, k + 1, tiles, H] fp32   ids [N, k]   out [N, H]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _moe_partial_sum_kernel(y_ptr, ids_ptr, out_ptr, FIRST, stride_yn, stride_yk, stride_yt, stride_on,
                            K: tl.constexpr, E: tl.constexpr, H: tl.constexpr,
                            ROUTED_TILES: tl.constexpr, SHARED_TILES: tl.constexpr, TP: tl.constexpr,
                            BH: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_n, i_h = tl.program_id(0), tl.program_id(1)
    o_t = tl.arange(0, TP)
    o_h = i_h * BH + tl.arange(0, BH)
    h_ok = o_h < H
    p_y = y_ptr + i_n * stride_yn + o_t[:, None] * stride_yt + o_h[None, :]
    total = tl.zeros([BH], dtype=tl.float32)
    for j in tl.static_range(K + (SHARED_TILES > 0)):
        if j < K:  # a routed expert's rows: only where this call holds the expert
            b_e = tl.load(ids_ptr + i_n * K + j + o_t * 0) - FIRST  # [TP] the expert, once per tile row
            t_ok = (o_t < ROUTED_TILES) & (b_e >= 0) & (b_e < E)
        else:
            t_ok = o_t < SHARED_TILES
        b_y = tl.load(p_y + j * stride_yk, mask=t_ok[:, None] & h_ok[None, :], other=0.0)  # [TP, BH]
        total += tl.sum(b_y, 0)
    tl.store(out_ptr + i_n * stride_on + o_h, total.to(out_ptr.dtype.element_ty), mask=h_ok)


def launch_partial_sum(y, ids, out, n_experts: int, intermediate: int, shared_intermediate: int, block_n: int,
                       first_expert: int = 0, block_h: int = 128) -> None:
    """y [N, k + 1, tiles, H] from `one_pass.launch_one_pass` (tiles of block_n intermediate
    columns), ids [N, k] (contiguous) over experts [first_expert, first_expert + n_experts) held
    here, out [N, H] (written); intermediate / shared_intermediate: I and Is (0: no shared expert)."""
    n, k1, tiles, h = y.shape
    if tuple(ids.shape) != (n, k1 - 1) or not ids.is_contiguous():
        raise ValueError(f"launch_partial_sum: ids must be contiguous [N, k] = {(n, k1 - 1)}, got "
                         f"{tuple(ids.shape)} with strides {ids.stride()}")
    if y.dtype != torch.float32 or y.stride(3) != 1 or tiles < triton.cdiv(max(intermediate, shared_intermediate), block_n):
        raise ValueError(f"launch_partial_sum: y must be fp32 [N, k + 1, tiles >= "
                         f"{triton.cdiv(max(intermediate, shared_intermediate), block_n)}, H] with unit last stride, "
                         f"got {y.dtype} {tuple(y.shape)} with strides {y.stride()}")
    if tuple(out.shape) != (n, h) or out.stride(1) != 1:
        raise ValueError(f"launch_partial_sum: out must be [N, H] = {(n, h)} with unit column stride, got "
                         f"{tuple(out.shape)} with strides {out.stride()}")
    bh = min(block_h, max(16, triton.next_power_of_2(h)))
    _moe_partial_sum_kernel[(n, triton.cdiv(h, bh))](
        y, ids, out, first_expert, y.stride(0), y.stride(1), y.stride(2), out.stride(0),
        K=k1 - 1, E=n_experts, H=h, ROUTED_TILES=triton.cdiv(intermediate, block_n),
        SHARED_TILES=triton.cdiv(shared_intermediate, block_n), TP=max(2, triton.next_power_of_2(tiles)), BH=bh,
        num_warps=4, **pdl.options(y))
