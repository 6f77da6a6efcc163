"""Second half of the experts for calls of a few tokens, by column tile: out_n = sum_j act[n, j]
W_down_{ids[n, j]}^T summed in the order j = 0..k (the shared expert's at j = k), the same
products and the same sum as `down.py`, bit for bit, with no rows of y, no arrival counters and no
last program.

Grid (ceil(H / BH),): program t owns output columns t·BH..t·BH+BH−1 of every token and walks,
token by token, the token's k + 1 experts in order, each in steps of BK over the intermediate
dimension, as one flat loop (so the pipeline keeps the next experts' weight tiles in flight across
the experts' boundaries). At the 35B shapes and one token that is 128 programs, one per SM, each
streaming its [BH, I] slice of nine experts' down weights; `down.py`'s grid (one program per
distinct expert and column tile) needs an [N, k + 1, H] round trip through y and a second, serial
chain for the last arrival's sum. A token's experts are read once per token, so calls of many
tokens that share experts read them again: it suits calls of a few tokens only.

Each product is the [BM, BH] tile product of `down.py` with the token's row at its own row n and
the other rows zero (rows of a tile product do not mix), accumulated from zero in steps of BK (the
tensor cores chain a step's 16-deep slices in order, so a wider step than `down.py`'s gives the
same bits; `tests/gpu/test_moe.py` checks both widths); rows of experts held elsewhere (expert
parallelism) add a zero, as the masked loads of `down.py`'s sum do. The call's ids are read before
the programmatic-dependent-launch wait (the router wrote them two or more launches back), and with
`down_early_weights` the first token's first weight tile too.

    act [N, k + 1, max(I, Is)]   down [E, H, I]   shared down [H, Is]   ids [N, k]   out [N, H]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.down import column_tiles
from hybridspec.kernels.moe.tuning import step_width
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt


@triton.jit
def _expert_rows(d_ptr, sd_ptr, b_ids, n, j, o_h, FIRST, stride_de, stride_dh, stride_sdh, K: tl.constexpr,
                 E: tl.constexpr, I: tl.constexpr, IS: tl.constexpr, NKP: tl.constexpr):
    """(pointers [BH] to rows o_h of token n's j-th expert's down weights, its depth): the routed
    expert ids[n, j] for j < K, taken from the call's ids b_ids [NKP] held in registers (no load,
    so the loop's weight addresses are known stages ahead), the shared expert at j = K; depth 0
    where the expert is held elsewhere (its rows add a zero)."""
    routed = j < K
    e = tl.sum(tl.where(tl.arange(0, NKP) == n * K + j, b_ids, 0), 0) - FIRST
    held = (e >= 0) & (e < E)
    base = tl.where(routed, d_ptr + tl.where(held, e, 0) * stride_de, sd_ptr)
    stride = tl.where(routed, stride_dh, stride_sdh)
    depth = tl.where(routed, tl.where(held, I, 0), IS)
    return base + o_h * stride, depth


@triton.jit
def _moe_down_columns_kernel(act_ptr, d_ptr, sd_ptr, ids_ptr, out_ptr, FIRST, stride_an, stride_ak, stride_de,
                             stride_dh, stride_sdh, stride_on, N, K: tl.constexpr, E: tl.constexpr,
                             H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr, BM: tl.constexpr,
                             BH: tl.constexpr, BK: tl.constexpr, NKP: tl.constexpr, EARLY: tl.constexpr,
                             PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    i_t = tl.program_id(0)
    o_m = tl.arange(0, BM)
    o_h = i_t * BH + tl.arange(0, BH)
    o_c = tl.arange(0, BK)
    h_ok = o_h < H
    STEPS: tl.constexpr = (I + BK - 1) // BK  # steps of a routed expert
    SHARED_STEPS: tl.constexpr = (IS + BK - 1) // BK  # and of the shared expert (0 without one)
    PER_TOKEN: tl.constexpr = K * STEPS + SHARED_STEPS
    o_a = tl.arange(0, NKP)
    b_ids = tl.load(ids_ptr + o_a, mask=o_a < N * K, other=0).to(tl.int64)  # [NKP] written two launches back
    p_d0, depth0 = _expert_rows(d_ptr, sd_ptr, b_ids, 0, 0, o_h, FIRST, stride_de, stride_dh, stride_sdh, K, E, I, IS,
                                NKP)
    d_ok0 = h_ok[:, None] & (o_c < depth0)[None, :]  # [BH, BK]
    if EARLY:  # token 0's first expert's first tile: the ids are two launches old
        b_d0 = tl.load(p_d0[:, None] + o_c[None, :], mask=d_ok0, other=0.0)
    if USE_GDC:
        wait_then_release()
    if not EARLY:
        b_d0 = tl.load(p_d0[:, None] + o_c[None, :], mask=d_ok0, other=0.0)
    b_a = tl.load(act_ptr + o_m[:, None] * stride_an + o_c[None, :],
                  mask=(o_m == 0)[:, None] & (o_c < depth0)[None, :], other=0.0)  # [BM, BK] token 0, j = 0
    acc = dot_bt(b_a, b_d0, tl.zeros([BM, BH], dtype=tl.float32), PRECISION, WIDEN)
    total = tl.zeros([BM, BH], dtype=tl.float32)
    total = tl.where((o_m == 0)[:, None] & (BK >= depth0), total + acc, total)
    for it in range(1, N * PER_TOKEN):  # (token, expert, step) in order, the first done above
        n = it // PER_TOKEN
        r = it % PER_TOKEN
        j = tl.minimum(r // STEPS, K)
        c = tl.where(j < K, r - j * STEPS, r - K * STEPS) * BK
        p_d, depth = _expert_rows(d_ptr, sd_ptr, b_ids, n, j, o_h, FIRST, stride_de, stride_dh, stride_sdh, K, E, I,
                                  IS, NKP)
        k_ok = c + o_c < depth
        b_d = tl.load(p_d[:, None] + c + o_c[None, :], mask=h_ok[:, None] & k_ok[None, :], other=0.0)  # [BH, BK]
        b_a = tl.load(act_ptr + o_m[:, None] * stride_an + j * stride_ak + c + o_c[None, :],
                      mask=(o_m == n)[:, None] & k_ok[None, :], other=0.0)  # [BM, BK] row n
        acc = dot_bt(b_a, b_d, tl.where(c == 0, 0.0, acc), PRECISION, WIDEN)  # from zero at each expert
        done = (o_m == n)[:, None] & (c + BK >= depth)  # row n's product for expert j complete
        total = tl.where(done, total + acc, total)
    tl.store(out_ptr + o_m[:, None] * stride_on + o_h[None, :], total.to(out_ptr.dtype.element_ty),
             mask=(o_m < N)[:, None] & h_ok[None, :])


def launch_down_columns(act, down, shared, ids, out, block_m: int, tuning, widen: bool, first_expert: int = 0) -> None:
    """act [N, k + 1, max(I, Is)] from the gate_up kernel, down [E, H, I] (experts first_expert…
    first_expert + E − 1 of the ids), shared (or None), ids [N, k] (contiguous), out [N, H]
    (written); block_m: the rows of `down.py`'s tiles for this call (its products, bit for bit);
    the step width is the tuning's down_bk as `down.py` takes it; widen: under the interpreter."""
    n, k1 = act.shape[:2]
    e, h, i = down.shape
    if tuple(ids.shape) != (n, k1 - 1) or not ids.is_contiguous():
        raise ValueError(f"launch_down_columns: ids must be contiguous [N, k] = {(n, k1 - 1)}, got "
                         f"{tuple(ids.shape)} with strides {ids.stride()}")
    if n > block_m:
        raise ValueError(f"launch_down_columns: {n} tokens in tiles of {block_m} rows")
    i_s = shared.down.shape[1] if shared is not None else 0
    sd = shared.down if shared is not None else down[0]
    bh = column_tiles(h, tuning)[0]  # `down.py`'s column width for the same tuning
    bk = step_width(tuning.down_bk, max(i, i_s), block_m + bh, act.element_size(), tuning.down_stages)
    _moe_down_columns_kernel[(triton.cdiv(h, bh),)](
        act, down, sd, ids, out, first_expert, act.stride(0), act.stride(1), down.stride(0), down.stride(1),
        sd.stride(0), out.stride(0), N=n, K=k1 - 1, E=e, H=h, I=i, IS=i_s, BM=block_m, BH=bh, BK=bk,
        NKP=triton.next_power_of_2(n * (k1 - 1)),  # the call's ids only: fewer barriers to pick one
        EARLY=tuning.down_early_weights, PRECISION="ieee" if act.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.down_warps, num_stages=tuning.down_stages, **pdl.options(act))
