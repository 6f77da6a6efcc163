"""The drafter's block statistics from its logits in one launch (`reference.draft_statistics`'s
signature): each draft token, its softmax probability and the distribution's entropy.

Grid (D, ceil(V / BV)): program (i, b) reads logits[i, b·BV : (b+1)·BV] once (in fp32) and stores
its block's maximum m_b, s_b = Σ exp(x − m_b), t_b = Σ exp(x − m_b)·(x − m_b) and the lowest id
holding m_b. The program that arrives last combines every row's blocks in a fixed order:
M = max m_b, S = Σ s_b·e^(m_b − M), T = Σ (t_b + (m_b − M)·s_b)·e^(m_b − M) = Σ_v e^(x_v − M)(x_v − M);
the token is the lowest id holding M, its probability 1 / S, the entropy log S − T / S
(−Σ p log p with p = e^(x − M) / S, taken relative to M so that nothing cancels).

    logits [D, V] (unit column stride, any float dtype) → tokens [D] long, confidence, entropy [D] fp32
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import check_device
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.sampling import BLOCK_V
from hybridspec.kernels.sampling.blocks import arrive_with_block, load_blocks
from hybridspec.kernels.tiles import vocab_block


@triton.jit
def _draft_statistics_kernel(logits_ptr, part_ptr, index_ptr, arrivals_ptr, token_ptr, conf_ptr, ent_ptr, stride_l,
                             R, V, NB, BV: tl.constexpr, RP: tl.constexpr, NBP: tl.constexpr,
                             USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, i_b, o_v, ok, x = vocab_block(logits_ptr, stride_l, V, BV, float("-inf"))  # x [BV]
    m = tl.max(x, 0)  # finite: every block holds at least one logit
    d = tl.where(ok, x - m, 0.0)
    e = tl.where(ok, tl.exp(d), 0.0)
    lowest = tl.min(tl.where(x == m, o_v, V), 0)
    if arrive_with_block(part_ptr, index_ptr, arrivals_ptr, i_r, i_b, NB, m, tl.sum(e, 0), tl.sum(e * d, 0), lowest,
                         R * NB):  # the last program: combine the blocks of every row
        o_r = tl.arange(0, RP)
        both, b_m, b_s, b_t, b_id = load_blocks(part_ptr, index_ptr, R, NB, V, RP, NBP, False)  # [RP, NBP]: m, s, t
        row_max = tl.where(o_r < R, tl.max(b_m, 1), 0.0)  # [RP]
        shift = tl.where(both, b_m - row_max[:, None], 0.0)  # m_b − M ≤ 0
        scale = tl.where(both, tl.exp(shift), 0.0)
        total = tl.sum(b_s * scale, 1)  # S
        spread = tl.sum((b_t + shift * b_s) * scale, 1)  # T
        token = tl.min(tl.where(both & (b_m == row_max[:, None]), b_id, V), 1)
        rows = o_r < R
        safe = tl.where(rows, total, 1.0)
        tl.store(token_ptr + o_r, token.to(tl.int64), mask=rows)
        tl.store(conf_ptr + o_r, 1.0 / safe, mask=rows)
        tl.store(ent_ptr + o_r, tl.log(safe) - spread / safe, mask=rows)


def draft_statistics(logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """As `reference.draft_statistics`: logits [D, V] (unit column stride) → tokens [D] long, confidence
    and entropy [D] fp32; ties to the lowest id."""
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.shape[1]:
        raise ValueError(f"draft_statistics: logits must be [D, V] with V ≥ 1 and unit column stride, got "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    check_device("draft_statistics", logits=logits)
    rows, V = logits.shape
    nb = triton.cdiv(V, BLOCK_V)
    device = logits.device
    tokens = torch.empty(rows, dtype=torch.long, device=device)
    confidence = torch.empty(rows, dtype=torch.float32, device=device)
    entropy = torch.empty(rows, dtype=torch.float32, device=device)
    if rows:
        part = torch.empty(rows * nb * 3, dtype=torch.float32, device=device)  # per (row, block): m, s, t
        index = torch.empty(rows * nb, dtype=torch.int32, device=device)  # per (row, block): the lowest id of m
        arrivals = torch.zeros(1, dtype=torch.int32, device=device)  # zeroed by a fill kernel at every launch or replay
        _draft_statistics_kernel[(rows, nb)](
            logits, part, index, arrivals, tokens, confidence, entropy, logits.stride(0), rows, V, nb, BV=BLOCK_V,
            RP=max(2, triton.next_power_of_2(rows)), NBP=max(2, triton.next_power_of_2(nb)), num_warps=8,
            **pdl.options(logits))
    return tokens, confidence, entropy
