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
