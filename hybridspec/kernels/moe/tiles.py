"""`@triton.jit` helpers shared by the MoE kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def assignment_expert(ids_ptr, i_s, N, FIRST, E, K: tl.constexpr, BM: tl.constexpr, NKP: tl.constexpr,
                      KP: tl.constexpr):
    """Program row s's expert read from the ids [N, K] themselves: (e, b_kpos, active).
    e = ids[s // K, s % K] − FIRST (int64); active where this call holds e (0 <= e < E) and
    no earlier assignment has it, so each held distinct expert runs in exactly one row, that of its
    first assignment; b_kpos [BM] is, for token n, the position j with ids[n, j] − FIRST = e, or -1
    (a token's k experts are distinct)."""
    e = tl.load(ids_ptr + i_s).to(tl.int64) - FIRST
    o_a = tl.arange(0, NKP)
    earlier = tl.load(ids_ptr + o_a, mask=o_a < i_s, other=0).to(tl.int64) - FIRST  # [NKP]
    repeats = tl.sum(((o_a < i_s) & (earlier == e)).to(tl.int32), 0)
    active = (e >= 0) & (e < E) & (repeats == 0)
    o_m = tl.arange(0, BM)
    o_j = tl.arange(0, KP)
    ok = (o_m < N)[:, None] & (o_j < K)[None, :]
    b_ids = tl.load(ids_ptr + o_m[:, None] * K + o_j[None, :], mask=ok, other=0).to(tl.int64) - FIRST  # [BM, KP]
    b_kpos = tl.min(tl.where(ok & (b_ids == e), o_j[None, :], K), 1)  # [BM]
    return e, tl.where(b_kpos < K, b_kpos, -1), active


@triton.jit
def softmax_top_k(z, e_ok, K: tl.constexpr, RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_K: tl.constexpr, PACKED: tl.constexpr = False):
    """Rows of logits z [R, BLOCK_E] (fp32; columns outside e_ok ignored) → (weights, ids)
    [R, BLOCK_K]: the top K of each row's softmax by decreasing probability, ties to the lower id,
    renormalized to sum 1 when asked. PACKED: each round takes one max over int64 keys
    (probability bits << 32 | BLOCK_E − 1 − expert): probabilities are ≥ 0, whose fp32 bits order
    as the values do, and the masked −1 is negative, so the largest key is the largest
    probability's lowest expert."""
    cols = tl.arange(0, BLOCK_E)
    z = tl.where(e_ok[None, :], z, float("-inf"))
    p = tl.exp(z - tl.max(z, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    p = tl.where(e_ok[None, :], p, -1.0)
    slots = tl.arange(0, BLOCK_K)
    chosen_w = tl.zeros([z.shape[0], BLOCK_K], dtype=tl.float32)
    chosen_i = tl.zeros([z.shape[0], BLOCK_K], dtype=tl.int64)
    if PACKED:
        key = (p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - cols[None, :]).to(tl.int64)
    for j in tl.static_range(K):
        if PACKED:
            top = tl.max(key, axis=1)  # [R]
            index = (BLOCK_E - 1) - (top & 0xFFFFFFFF)
            best = (top >> 32).to(tl.int32).to(tl.float32, bitcast=True)
            key = tl.where(cols[None, :] == index[:, None], -(1 << 62), key)  # below every valid key (≥ 0);
            # a masked column's key is lower still, and K ≤ E leaves a valid key in every round
        else:
            best = tl.max(p, axis=1)  # [R]
            index = tl.min(tl.where(p == best[:, None], cols[None, :], BLOCK_E), axis=1)
            p = tl.where(cols[None, :] == index[:, None], -1.0, p)
        chosen_w = tl.where(slots[None, :] == j, best[:, None], chosen_w)
        chosen_i = tl.where(slots[None, :] == j, index[:, None].to(tl.int64), chosen_i)
    if RENORMALIZE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=1)[:, None]
    return chosen_w, chosen_i


@triton.jit
def route_partials(part_ptr, logits_ptr, ids_ptr, w_ptr, N, E, SPLIT: tl.constexpr, K: tl.constexpr,
                   RENORMALIZE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, TAIL_M: tl.constexpr,
                   PACKED: tl.constexpr):
    """A one-launch router's last step: the partial logits part [SPLIT, N, E] (fp32) summed over the
    spans in a fixed order, rounded to the logits' dtype (what the model's linear layer returns) and
    stored, then each token's softmax top-k (`softmax_top_k`) stored as ids [N, K] and weights."""
    t_m = tl.arange(0, TAIL_M)
    t_ok = t_m < N
    cols = tl.arange(0, BLOCK_E)
    ok = t_ok[:, None] & (cols < E)[None, :]
    z = tl.zeros([TAIL_M, BLOCK_E], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        z += tl.load(part_ptr + (s * N + t_m[:, None]) * E + cols[None, :], mask=ok, other=0.0, cache_modifier=".cg")
    z = z.to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + t_m[:, None] * E + cols[None, :], z, mask=ok)
    chosen_w, chosen_i = softmax_top_k(z.to(tl.float32), cols < E, K, RENORMALIZE, BLOCK_E, BLOCK_K, PACKED)
    slots = tl.arange(0, BLOCK_K)
    keep = t_ok[:, None] & (slots < K)[None, :]
    tl.store(ids_ptr + t_m[:, None] * K + slots[None, :], chosen_i, mask=keep)
    tl.store(w_ptr + t_m[:, None] * K + slots[None, :], chosen_w.to(w_ptr.dtype.element_ty), mask=keep)
