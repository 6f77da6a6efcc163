"""`reference.logprob_rows` in one launch.

Grid (n, ceil(V / BV)): program (i, b) reads logits[i, b·BV : (b+1)·BV] once (in fp32) and stores
its block's maximum m_b, s_b = Σ exp(x − m_b) and its K = next power of two ≥ top largest logits
as order keys (below). The program of row i that arrives last combines the row's blocks in a fixed
order: M = max m_b, S = Σ s_b·e^(m_b − M); log p(x) = x − M − log S; the row's top is the top of
its blocks' candidates (any token of the row's top is among its block's top K).

Order key of a logit x of token t, int64: (x's fp32 bits, sign-flipped so that signed integer
order is value order) << 32 | (2^31 − 1 − t), with −0 taken as +0. Keys order by decreasing value,
equal values by increasing id, and are distinct, so each selection is one bitonic top-K
(`tl.topk`) of the keys, not a max-and-argmin round per token. A block's positions past V load
−∞ with ids ≥ V: they rank below every token of the row, and a row has at least top tokens, so none
is taken. A NaN logit ranks by its bits (above +∞ when its sign bit is clear, below −∞ otherwise);
the reference's log-softmax would make the whole row NaN.

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
from hybridspec.kernels.tiles import last_to_arrive

BLOCK_V = 4096  # logits per (row, block) program
MAX_TOP = 64  # the most alternatives per row the kernel takes
_ID_BITS = 2147483647  # 2^31 − 1: a key's low 32 bits hold 2^31 − 1 − id


@triton.jit
def _order_keys(x, ids):
    """x [B] fp32, ids [B] int32 → int64 keys, larger for a larger value or an equal value of a lower id."""
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)  # −0 ties +0
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # a negative float's magnitude bits reversed
    return (ordered.to(tl.int64) << 32) | (_ID_BITS - ids).to(tl.int64)


@triton.jit
def _key_values(keys):
    """The fp32 values of order keys."""
    ordered = (keys >> 32).to(tl.int32)
    return (ordered ^ ((ordered >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _top_keys(keys, K: tl.constexpr):
    """The K largest of keys [B], descending (K a power of two)."""
    if K == 1:
        return tl.max(keys, 0)[None]
    return tl.topk(keys, K)


@triton.jit
def _logprob_rows_kernel(logits_ptr, token_ptr, part_ptr, key_ptr, arrivals_ptr, out_ptr, stride_l, V, NB,
                         TOP: tl.constexpr, K: tl.constexpr, BV: tl.constexpr, NBP: tl.constexpr, CP: tl.constexpr,
                         USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, i_b = tl.program_id(0), tl.program_id(1)
    o_v = i_b * BV + tl.arange(0, BV)
    ok = o_v < V
    p_logits = logits_ptr + i_r.to(tl.int64) * stride_l  # row i (64-bit: n · V may pass 2^31)
    x = tl.load(p_logits + o_v, mask=ok, other=float("-inf")).to(tl.float32)  # [BV]
    b_m = tl.max(x, 0)
    b_s = tl.sum(tl.where(ok, tl.exp(x - tl.where(b_m > float("-inf"), b_m, 0.0)), 0.0), 0)
    p_block = i_r * NB + i_b
    tl.store(part_ptr + p_block * 2, b_m)
    tl.store(part_ptr + p_block * 2 + 1, b_s)
    if TOP > 0:
        tl.store(key_ptr + p_block * K + tl.arange(0, K), _top_keys(_order_keys(x, o_v), K))  # [K] descending
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
        chosen = tl.load(p_logits + token).to(tl.float32)
        tl.store(row, chosen - shift - log_total)
        if TOP > 0:
            o_c = tl.arange(0, CP)
            given = o_c < NB * K
            keys = tl.load(key_ptr + i_r * NB * K + o_c, mask=given, other=0, cache_modifier=".cg")  # [CP]
            keys = tl.where(given, keys, -9223372036854775807 - 1)  # padding below every key
            best = _top_keys(keys, K)  # [K] descending
            o_k = tl.arange(0, K)
            kept = o_k < TOP
            tl.store(row + 1 + o_k, _key_values(best) - shift - log_total, mask=kept)
            tl.store(row + 1 + TOP + o_k, (_ID_BITS - (best & _ID_BITS)).to(tl.float32), mask=kept)


def logprob_rows(logits: Tensor, tokens: Tensor, top: int, out: Tensor | None = None, *,
                 block_v: int = BLOCK_V) -> Tensor:
    """As `reference.logprob_rows`: logits [n, V] (unit column stride), tokens [n] long, 0 ≤ top ≤
    min(V, MAX_TOP) → [n, 1 + 2·top] fp32, into `out` when given (contiguous fp32 of that shape);
    `block_v` logits per program (a power of two, at least 64)."""
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
    if block_v < MAX_TOP or block_v & (block_v - 1):
        raise ValueError(f"{fn}: block_v must be a power of two of at least {MAX_TOP}, got {block_v}")
    check_device(fn, logits=logits, tokens=tokens, out=out)
    if not n:
        return out
    nb, k = triton.cdiv(V, block_v), triton.next_power_of_2(max(top, 1))
    device = logits.device
    part = torch.empty(n * nb * 2, dtype=torch.float32, device=device)  # per (row, block): m, s
    keys = torch.empty(n * nb * k, dtype=torch.int64, device=device)  # per (row, block): its top K order keys
    arrivals = torch.zeros(n, dtype=torch.int32, device=device)  # per row; zeroed at every launch or replay
    _logprob_rows_kernel[(n, nb)](logits, tokens, part, keys, arrivals, out, logits.stride(0), V, nb, TOP=top,
                                  K=k, BV=block_v, NBP=max(2, triton.next_power_of_2(nb)),
                                  CP=max(2, triton.next_power_of_2(nb * k)), num_warps=8, **pdl.options(logits))
    return out
