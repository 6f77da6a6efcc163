"""The point-mass rule under top-k (k ≤ KMAX) and top-p from the target's logits, in two launches
(`reference.point_mass_filtered`'s signature and draws).

After `candidates.py`, program i (grid (w,)) takes row i's top k from its blocks' candidates by
decreasing value (ties to the lower id, the reference's stable sort), their probabilities
exp(z_j − z_0) renormalised over the k, the smallest prefix whose mass reaches top_p (a token is
kept while the mass strictly before it is below top_p), renormalised again: q. It tests ξ_i ≤ q(d_i)
and runs row i's exponential race over the kept tokens, excluding d_i (the residual's removal; the
last row excludes nothing), in log space (z_j − log E_j, the kept tokens sharing one normaliser).
The program that arrives last takes A (the leading kept drafts) and row A's winner.

A result can differ from the reference's, which normalises over the whole vocabulary before the
cut and compares q_v / E_v, only where two values agree to float rounding.

    draft [w−1] long   logits [w, V]   inv_temperature, top_p [1] fp32   top_k, seed, start [1] long
    → accepted [1] long, x_new [1] long
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.sampling import BLOCK_V
from hybridspec.kernels.sampling.candidates import KMAX, launch_candidates
from hybridspec.kernels.sampling.checks import check_rule_args
from hybridspec.kernels.sampling.draws import position_key, uniform
from hybridspec.kernels.sampling.reference import ACCEPT_LANE
from hybridspec.kernels.tiles import last_to_arrive


@triton.jit
def _filtered_rule_kernel(draft_ptr, value_ptr, id_ptr, top_k_ptr, top_p_ptr, seed_ptr, start_ptr, kept_ptr,
                          winner_ptr, arrivals_ptr, accepted_ptr, x_new_ptr, W, V, NB, ACCEPT: tl.constexpr,
                          KMAX: tl.constexpr, NBP: tl.constexpr, WP: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_w = tl.program_id(0)
    k = tl.minimum(tl.maximum(tl.load(top_k_ptr).to(tl.int32), 1), KMAX)
    o_b = tl.arange(0, NBP)
    o_j = tl.arange(0, KMAX)
    ok = (o_b < NB)[:, None] & (o_j < k)[None, :]
    p_c = (i_w * NB + o_b[:, None]) * KMAX + o_j[None, :]
    c_z = tl.load(value_ptr + p_c, mask=ok, other=float("-inf"))  # [NBP, KMAX] candidates
    c_v = tl.load(id_ptr + p_c, mask=ok, other=V)
    c_z = tl.where(ok, c_z, float("-inf"))
    s_z = tl.full([KMAX], float("-inf"), tl.float32)  # the row's top k, by decreasing value
    s_v = tl.full([KMAX], V, tl.int32)
    for j in range(0, k):
        best = tl.max(tl.max(c_z, 1), 0)
        winner = tl.min(tl.min(tl.where(c_z == best, c_v, V), 1), 0)  # ties to the lower id
        s_z = tl.where(o_j == j, best, s_z)
        s_v = tl.where(o_j == j, winner, s_v)
        c_z = tl.where(c_v == winner, float("-inf"), c_z)
    top = o_j < k
    p = tl.where(top, tl.exp(s_z - tl.max(s_z, 0)), 0.0)
    p = p / tl.sum(p, 0)
    before = tl.cumsum(p, 0) - p  # mass strictly above each token
    keep = top & (before < tl.load(top_p_ptr).to(tl.float32)) & (s_z > float("-inf"))
    q = tl.where(keep, p, 0.0)
    q = q / tl.sum(q, 0)
    tested = i_w < W - 1
    d = tl.load(draft_ptr + i_w, mask=tested, other=-1)  # d_i, or -1 on the last row
    seed = tl.load(seed_ptr).to(tl.int64)
    key = position_key(seed, tl.load(start_ptr).to(tl.int64) + i_w)
    q_d = tl.sum(tl.where(s_v == d, q, 0.0), 0)
    kept = uniform(key, ACCEPT) <= q_d
    race = tl.where(keep & (s_v != d), s_z - tl.log(-tl.log(uniform(key, 1 + s_v.to(tl.int64)))), float("-inf"))
    fastest = tl.max(race, 0)
    tl.store(winner_ptr + i_w, tl.min(tl.where(race == fastest, s_v, V), 0))
    tl.store(kept_ptr + i_w, kept.to(tl.int32))
    if last_to_arrive(arrivals_ptr, W):  # the last program: the accepted count and its row's winner
        o_r = tl.arange(0, WP)
        b_kept = tl.load(kept_ptr + o_r, mask=o_r < W - 1, other=1, cache_modifier=".cg")
        accepted = tl.min(tl.where((o_r < W - 1) & (b_kept == 0), o_r, W - 1), 0)
        tl.store(accepted_ptr, accepted.to(tl.int64))
        tl.store(x_new_ptr, tl.load(winner_ptr + accepted, cache_modifier=".cg").to(tl.int64))


def point_mass_filtered(draft: Tensor, logits: Tensor, inv_temperature: Tensor, top_k: Tensor, top_p: Tensor,
                        seed: Tensor, start: Tensor) -> tuple[Tensor, Tensor]:
    """draft [w−1] long, logits [w, V] (unit column stride), inv_temperature, top_p [1] fp32,
    top_k [1] long (1 ≤ top_k ≤ KMAX, read on the device and clamped to that range, so the caller
    checks it), seed, start [1] long → (A [1] long, x_new [1] long)."""
    w, V = check_rule_args("point_mass_filtered", draft, logits)
    nb = triton.cdiv(V, BLOCK_V)
    device = logits.device
    arrivals = torch.zeros(1, dtype=torch.int32, device=device)  # a fill kernel before the two launches, so they chain
    values = torch.empty((w, nb, KMAX), dtype=torch.float32, device=device)
    ids = torch.empty((w, nb, KMAX), dtype=torch.int32, device=device)
    launch_candidates(logits, inv_temperature, top_k, values, ids, BLOCK_V)
    kept = torch.empty(w, dtype=torch.int32, device=device)
    winner = torch.empty(w, dtype=torch.int32, device=device)
    accepted = torch.empty(1, dtype=torch.long, device=device)
    x_new = torch.empty(1, dtype=torch.long, device=device)
    _filtered_rule_kernel[(w,)](draft.contiguous(), values, ids, top_k, top_p, seed, start, kept, winner, arrivals,
                                accepted, x_new, w, V, nb, ACCEPT=ACCEPT_LANE, KMAX=KMAX,
                                NBP=max(2, triton.next_power_of_2(nb)), WP=max(2, triton.next_power_of_2(w)),
                                num_warps=8, **pdl.options(logits))
    return accepted, x_new
