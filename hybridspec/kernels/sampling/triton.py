"""The point-mass rule from the target's logits in one launch, `reference.point_mass_from_logits`'s
signature and draws (unfiltered sampling: temperature, no top-k / top-p).

Grid (w, ceil(V / BV)): program (i, b) reads logits[i, b·BV : (b+1)·BV] once, scaled by
1 / temperature (z), and stores for its block the maximum m_b and Σ exp(z − m_b) (row i's softmax,
in pieces) and its entry of row i's exponential race. The race is taken in log space:
argmax_v p_v / E_v = argmax_v (z_v − log E_v) with E_v = −log u_v (p_v ∝ exp z_v), so no block
needs the row's normaliser; row i excludes its draft token d_i (the residual's removal), the last
row excludes nothing. The program that arrives last combines the blocks: M_i, S_i (a fixed-order
sum), p_i(d_i) = exp(z_{i,d_i} − M_i) / S_i against ξ_i for the accepted count A, then the race
winner of row A (ties to the lower id).

The uniforms are `reference.keyed_uniforms`' exactly (the same 32-bit hash in int64). A result
can differ from the reference's, which divides by the normaliser and compares p_v / E_v, only
where two values agree to float rounding.

    draft [w−1] long   logits [w, V]   inv_temperature [1] fp32   seed, start [1] long
    → accepted [1] long, x_new [1] long
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.sampling import BLOCK_V
from hybridspec.kernels.sampling.blocks import arrive_with_block, load_blocks
from hybridspec.kernels.sampling.checks import check_rule_args
from hybridspec.kernels.sampling.draws import position_key, uniform
from hybridspec.kernels.sampling.reference import ACCEPT_LANE


@triton.jit
def _point_mass_kernel(draft_ptr, logits_ptr, inv_t_ptr, seed_ptr, start_ptr, part_ptr, index_ptr, arrivals_ptr,
                       accepted_ptr, x_new_ptr, stride_l, W, V, NB, ACCEPT: tl.constexpr, BV: tl.constexpr,
                       WP: tl.constexpr, NBP: tl.constexpr):
    i_w, i_b = tl.program_id(0), tl.program_id(1)
    inv_t = tl.load(inv_t_ptr).to(tl.float32)
    seed = tl.load(seed_ptr).to(tl.int64)
    start = tl.load(start_ptr).to(tl.int64)
    o_v = i_b * BV + tl.arange(0, BV)
    v_ok = o_v < V
    z = tl.load(logits_ptr + i_w * stride_l + o_v, mask=v_ok, other=float("-inf")).to(tl.float32) * inv_t  # [BV]
    m = tl.max(z, 0)
    s = tl.sum(tl.exp(z - tl.where(m == float("-inf"), 0.0, m)), 0)  # 0 for a block masked to -inf throughout
    excluded = tl.load(draft_ptr + i_w, mask=i_w < W - 1, other=-1)  # d_i, or -1 on the last row
    u = uniform(position_key(seed, start + i_w), 1 + o_v.to(tl.int64))  # [BV] token v's lane 1 + v
    race = tl.where(v_ok & (o_v != excluded), z - tl.log(-tl.log(u)), float("-inf"))  # log(p_v / E_v) + const
    best = tl.max(race, 0)
    winner = tl.min(tl.where(race == best, o_v, V), 0)
    # this block's [m, Σ exp(z − m), best race value] and its race winner
    if arrive_with_block(part_ptr, index_ptr, arrivals_ptr, i_w, i_b, NB, m, s, best, winner,
                         W * NB):  # the last program: combine the blocks of every row
        o_r = tl.arange(0, WP)
        ok, b_m, b_s, b_best, b_win = load_blocks(part_ptr, index_ptr, W, NB, V, WP, NBP, True)  # [WP, NBP]
        row_max = tl.max(b_m, 1)  # [WP]
        row_max = tl.where(o_r < W, row_max, 0.0)
        row_sum = tl.sum(tl.where(ok & (b_m > float("-inf")), b_s * tl.exp(b_m - row_max[:, None]), 0.0), 1)  # [WP]
        tested = o_r < W - 1
        b_d = tl.load(draft_ptr + o_r, mask=tested, other=0)  # [WP]
        z_d = tl.load(logits_ptr + o_r * stride_l + b_d, mask=tested, other=0.0).to(tl.float32) * inv_t
        p_d = tl.exp(z_d - row_max) / tl.where(tested, row_sum, 1.0)  # p_i(d_i)
        xi = uniform(position_key(seed, start + o_r), tl.full([WP], ACCEPT, tl.int64))
        rejected = tested & (xi > p_d)
        accepted = tl.min(tl.where(rejected, o_r, W - 1), 0)  # leading drafts kept
        row_best = tl.where((o_r == accepted)[:, None] & ok, b_best, float("-inf"))
        top = tl.max(tl.max(row_best, 1), 0)
        x_new = tl.min(tl.min(tl.where((row_best == top) & (o_r == accepted)[:, None], b_win, V), 1), 0)
        tl.store(accepted_ptr, accepted.to(tl.int64))
        tl.store(x_new_ptr, x_new.to(tl.int64))


def point_mass_from_logits(draft: Tensor, logits: Tensor, inv_temperature: Tensor, seed: Tensor,
                           start: Tensor) -> tuple[Tensor, Tensor]:
    """draft [w−1] long, logits [w, V] (unit column stride), inv_temperature [1] fp32, seed and
    start [1] long → (A [1] long, x_new [1] long); row i decides the token at position start + i."""
    w, V = check_rule_args("point_mass_from_logits", draft, logits)
    nb = triton.cdiv(V, BLOCK_V)
    device = logits.device
    part = torch.empty(w * nb * 3, dtype=torch.float32, device=device)  # per (row, block): m, Σ exp, race
    index = torch.empty(w * nb, dtype=torch.int32, device=device)  # per (row, block): its race winner
    arrivals = torch.zeros(1, dtype=torch.int32, device=device)  # zeroed by a fill kernel at every launch or replay
    accepted = torch.empty(1, dtype=torch.long, device=device)
    x_new = torch.empty(1, dtype=torch.long, device=device)
    _point_mass_kernel[(w, nb)](draft.contiguous(), logits, inv_temperature, seed, start, part, index, arrivals,
                                accepted, x_new, logits.stride(0), w, V, nb, ACCEPT=ACCEPT_LANE, BV=BLOCK_V,
                                WP=max(2, triton.next_power_of_2(w)), NBP=max(2, triton.next_power_of_2(nb)),
                                num_warps=8)
    return accepted, x_new
