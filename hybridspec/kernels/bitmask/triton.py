"""`reference.masked_logits` in one launch: program (i, b) reads row i's logits b·BV … (b+1)·BV − 1
and the BV / 32 words of its bitmask, and writes the fp32 logits with the refused tokens at −inf.

    logits [w, V] (unit column stride, any float dtype)   bitmask [w, ⌈V/32⌉] int32 (contiguous)
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
from hybridspec.kernels.tiles import vocab_block

BLOCK_V = 4096  # logits per program


@triton.jit
def _masked_logits_kernel(logits_ptr, bitmask_ptr, out_ptr, stride_l, V, WORDS, BV: tl.constexpr,
                          USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, _, o_v, ok, x = vocab_block(logits_ptr, stride_l, V, BV, 0.0)
    row = i_r.to(tl.int64)  # 64-bit row offsets: w · V may pass 2^31
    word = tl.load(bitmask_ptr + row * WORDS + (o_v >> 5), mask=ok, other=0)  # [BV]: each token's word
    allowed = ((word >> (o_v & 31)) & 1) != 0
    tl.store(out_ptr + row * V + o_v, tl.where(allowed, x, float("-inf")), mask=ok)


def masked_logits(logits: Tensor, bitmask: Tensor) -> Tensor:
    """As `reference.masked_logits` (shapes in the module docstring)."""
    fn = "masked_logits"
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"{fn}: logits must be [w, V] with unit column stride, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    w, V = logits.shape
    words = triton.cdiv(V, 32)
    if bitmask.dtype != torch.int32 or tuple(bitmask.shape) != (w, words) or not bitmask.is_contiguous():
        raise ValueError(f"{fn}: bitmask must be contiguous int32 {(w, words)}, got {bitmask.dtype} "
                         f"{tuple(bitmask.shape)} strides {bitmask.stride()}")
    check_device(fn, logits=logits, bitmask=bitmask)
    out = torch.empty(w, V, dtype=torch.float32, device=logits.device)
    if w and V:
        _masked_logits_kernel[(w, triton.cdiv(V, BLOCK_V))](logits, bitmask, out, logits.stride(0), V, words,
                                                           BV=BLOCK_V, num_warps=8, **pdl.options(logits))
    return out
