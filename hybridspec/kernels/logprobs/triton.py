"""`reference.logprob_rows` in one launch.

Grid (n, ceil(V / BV)): program (i, b) reads logits[i, b·BV : (b+1)·BV] once (in fp32) and stores
its block's maximum m_b, s_b = Σ exp(x − m_b) and its K = max(top, 1) largest logits by decreasing
value (ties to the lower id) with their ids. The program of row i that arrives last combines the
row's blocks in a fixed order: M = max m_b, S = Σ s_b·e^(m_b − M); log p(x) = x − M − log S; the
row's top logits are the top of its blocks' candidates (any token of the row's top is among its
block's top), and candidates are laid out block by block, each block's by decreasing value with
ties by id, so taking the lowest position among equal values takes the lowest id. Each token is
taken once, −∞ ones included (a row with fewer finite logits than `top` fills the rest with −∞
tokens by id). A NaN logit is not ordered (compiled `tl.max` passes over it); the reference's
log-softmax would make the whole row NaN.

    logits [n, V] (unit column stride, any float dtype)   tokens [n] long   top ≤ min(V, 64)
    → [n, 1 + 2·top] fp32 (`reference.py`); ties in the top go to the lower id
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import check_device
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import last_to_arrive, vocab_block

BLOCK_V = 4096  # logits per (row, block) program
MAX_TOP = 64  # the most alternatives per row the kernel takes


@triton.jit
def _logprob_rows_kernel(logits_ptr, token_ptr, part_ptr, value_ptr, id_ptr, arrivals_ptr, out_ptr, stride_l, V, NB,
                         TOP: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, NBP: tl.constexpr, CP: tl.constexpr,
                         USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, i_b, o_v, ok, x = vocab_block(logits_ptr, stride_l, V, BV, float("-inf"))  # x [BV]
    b_m = tl.max(x, 0)
    b_s = tl.sum(tl.where(ok, tl.exp(x - tl.where(b_m > float("-inf"), b_m, 0.0)), 0.0), 0)
    p_block = i_r * NB + i_b
    tl.store(part_ptr + p_block * 2, b_m)
    tl.store(part_ptr + p_block * 2 + 1, b_s)
    left = ok  # [BV]: tokens not yet taken
    for j in tl.static_range(K):  # the block's K largest, by decreasing value, ties to the lower id
        best = tl.max(tl.where(left, x, float("-inf")), 0)
        winner = tl.min(tl.where(left & (x == best), o_v, V + BV), 0)  # −∞ ones too, each once
        tl.store(value_ptr + p_block * K + j, best)
        tl.store(id_ptr + p_block * K + j, winner)
        left = left & (o_v != winner)
    if last_to_arrive(arrivals_ptr + i_r, NB):  # the row's last program: combine its blocks
        o_b = tl.arange(0, NBP)
        has = o_b < NB
        p_row = part_ptr + (i_r * NB + o_b) * 2
        m = tl.load(p_row, mask=has, other=float("-inf"), cache_modifier=".cg")  # [NBP]
        s = tl.load(p_row + 1, mask=has, other=0.0, cache_modifier=".cg")
        row_max = tl.max(m, 0)
        shift = tl.where(row_max > float("-inf"), row_max, 0.0)
        log_total = tl.log(tl.sum(tl.where(has, s * tl.exp(m - shift), 0.0), 0))
        row = out_ptr + i_r * (1 + 2 * TOP)
        token = tl.load(token_ptr + i_r)
        chosen = tl.load(logits_ptr + i_r.to(tl.int64) * stride_l + token).to(tl.float32)  # 64-bit row offset
        tl.store(row, chosen - shift - log_total)
        o_c = tl.arange(0, CP)
        given = o_c < NB * K
        value = tl.load(value_ptr + i_r * NB * K + o_c, mask=given, other=float("-inf"), cache_modifier=".cg")
        ids = tl.load(id_ptr + i_r * NB * K + o_c, mask=given, other=0, cache_modifier=".cg")
        candidates = given & (ids < V)  # [CP]: not yet taken (a block of fewer than K tokens fills its rest past V)
        for j in tl.static_range(TOP):
            best = tl.max(tl.where(candidates, value, float("-inf")), 0)
            at = tl.min(tl.where(candidates & (value == best), o_c, CP), 0)  # the lowest position holding it: the lowest id
            tl.store(row + 1 + j, best - shift - log_total)
            tl.store(row + 1 + TOP + j, tl.sum(tl.where(o_c == at, ids, 0), 0).to(tl.float32))
            candidates = candidates & (o_c != at)


def logprob_rows(logits: Tensor, tokens: Tensor, top: int, out: Tensor | None = None) -> Tensor:
    """As `reference.logprob_rows`: logits [n, V] (unit column stride), tokens [n] long, 0 ≤ top ≤
    min(V, MAX_TOP) → [n, 1 + 2·top] fp32, into `out` when given (contiguous fp32 of that shape)."""
    fn = "logprob_rows"
    if logits.dim() != 2 or logits.stride(1) != 1 or not logits.shape[1]:
        raise ValueError(f"{fn}: logits must be [n, V] with V ≥ 1 and unit column stride, got "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    n, V = logits.shape
    if not 0 <= top <= min(V, MAX_TOP):
        raise ValueError(f"{fn}: top must be in 0..{min(V, MAX_TOP)}, got {top}")
    if tokens.dtype != torch.long or tokens.numel() != n or not tokens.is_contiguous():
        raise ValueError(f"{fn}: tokens must be {n} contiguous long values, got {tokens.dtype} {tuple(tokens.shape)}")
    if out is None:
        out = torch.empty(n, 1 + 2 * top, dtype=torch.float32, device=logits.device)
    elif tuple(out.shape) != (n, 1 + 2 * top) or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(f"{fn}: out must be contiguous fp32 {(n, 1 + 2 * top)}, got {out.dtype} {tuple(out.shape)}")
    check_device(fn, logits=logits, tokens=tokens, out=out)
    if not n:
        return out
    nb, k = triton.cdiv(V, BLOCK_V), max(top, 1)
    device = logits.device
    part = torch.empty(n * nb * 2, dtype=torch.float32, device=device)  # per (row, block): m, s
    values = torch.empty(n * nb * k, dtype=torch.float32, device=device)  # per (row, block): its top logits
    ids = torch.empty(n * nb * k, dtype=torch.int32, device=device)
    arrivals = torch.zeros(n, dtype=torch.int32, device=device)  # per row; zeroed at every launch or replay
    _logprob_rows_kernel[(n, nb)](logits, tokens, part, values, ids, arrivals, out, logits.stride(0), V, nb, TOP=top,
                                  K=k, BV=BLOCK_V, NBP=max(2, triton.next_power_of_2(nb)),
                                  CP=max(2, triton.next_power_of_2(nb * k)), num_warps=8, **pdl.options(logits))
    return out
