"""`reference.penalized_logits` in two launches over (row, vocabulary block) programs.

Grid (w, ceil(V / BV)): program (i, b) counts d_1 … d_i on top of the output's counts for its
block's tokens, applies repetition, frequency, presence and bias, stores the block and two maxima:
over the tokens min_tokens leaves (every token where row i is past min_tokens) and over all tokens.
The second launch (`ban.py`) applies min_tokens' ban and min_p from those maxima.

    logits [w, V] (unit column stride, any float dtype)   drafts [≥ w − 1] long (any stride)
    counts, bias [V] fp32   prompt_seen, end [V] bool   scalars [6] fp32 (`reference.py`)
    → [w, V] fp32
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.interpreter import check_device
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.penalties.ban import launch_ban_and_min_p

BLOCK_V = 4096  # logits per (row, block) program


@triton.jit
def _penalize_kernel(logits_ptr, drafts_ptr, counts_ptr, seen_ptr, bias_ptr, end_ptr, scalars_ptr, out_ptr, part_ptr,
                     stride_l, stride_d, V, NB, BV: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, i_b = tl.program_id(0), tl.program_id(1)
    o_v = i_b * BV + tl.arange(0, BV)
    ok = o_v < V
    c = tl.load(counts_ptr + o_v, mask=ok, other=0.0)  # [BV]
    for j in range(0, i_r):  # row i follows d_1 … d_i
        c += tl.where(o_v == tl.load(drafts_ptr + j * stride_d), 1.0, 0.0)
    presence, frequency = tl.load(scalars_ptr), tl.load(scalars_ptr + 1)
    repetition = tl.load(scalars_ptr + 2)
    row = i_r.to(tl.int64)  # 64-bit row offsets: w · V may pass 2^31
    x = tl.load(logits_ptr + row * stride_l + o_v, mask=ok, other=0.0).to(tl.float32)
    seen = (tl.load(seen_ptr + o_v, mask=ok, other=0) != 0) | (c > 0)
    x = tl.where(seen, tl.where(x > 0, x / repetition, x * repetition), x)
    x = x - frequency * c - presence * tl.where(c > 0, 1.0, 0.0) + tl.load(bias_ptr + o_v, mask=ok, other=0.0)
    tl.store(out_ptr + row * V + o_v, x, mask=ok)
    early = tl.load(scalars_ptr + 3) + i_r.to(tl.float32) < tl.load(scalars_ptr + 4)  # one of the first min_tokens
    banned = tl.where(early, tl.load(end_ptr + o_v, mask=ok, other=0) != 0, False)
    p_part = part_ptr + (i_r * NB + i_b) * 2
    tl.store(p_part, tl.max(tl.where(ok & ~banned, x, float("-inf")), 0))  # over the tokens min_tokens leaves
    tl.store(p_part + 1, tl.max(tl.where(ok, x, float("-inf")), 0))  # over all


def penalized_logits(logits: Tensor, drafts: Tensor, counts: Tensor, prompt_seen: Tensor, bias: Tensor, end: Tensor,
                     scalars: Tensor) -> Tensor:
    """As `reference.penalized_logits` (shapes and dtypes in the module docstring)."""
    fn = "penalized_logits"
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"{fn}: logits must be [w, V] with unit column stride, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    w, V = logits.shape
    if drafts.dtype != torch.long or drafts.dim() != 1 or drafts.shape[0] < w - 1:
        raise ValueError(f"{fn}: drafts must be at least {w - 1} long values, got {drafts.dtype} {tuple(drafts.shape)}")
    for name, t, dtype, size in (("counts", counts, torch.float32, V), ("prompt_seen", prompt_seen, torch.bool, V),
                                 ("bias", bias, torch.float32, V), ("end", end, torch.bool, V),
                                 ("scalars", scalars, torch.float32, 6)):
        if t.dtype != dtype or tuple(t.shape) != (size,) or not t.is_contiguous():
            raise ValueError(f"{fn}: {name} must be contiguous {dtype} [{size}], got {t.dtype} {tuple(t.shape)}")
    check_device(fn, logits=logits, drafts=drafts, counts=counts, prompt_seen=prompt_seen, bias=bias, end=end,
                 scalars=scalars)
    out = torch.empty(w, V, dtype=torch.float32, device=logits.device)
    if not w or not V:
        return out
    nb = triton.cdiv(V, BLOCK_V)
    part = torch.empty(w * nb * 2, dtype=torch.float32, device=logits.device)  # per (row, block): two maxima
    drafts_ptr = drafts if drafts.numel() else counts  # read only by rows i ≥ 1, which need w ≥ 2 drafts' worth
    _penalize_kernel[(w, nb)](logits, drafts_ptr, counts, prompt_seen, bias, end, scalars, out, part, logits.stride(0),
                              drafts.stride(0) if drafts.numel() else 0, V, nb, BV=BLOCK_V, num_warps=8,
                              **pdl.options(logits))
    launch_ban_and_min_p(end, scalars, out, part, BLOCK_V)
    return out
