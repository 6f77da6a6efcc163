"""Triton router: softmax over the experts, top-k and renormalization in one launch, one program
per token (the PyTorch form, `reference.router_topk`, takes five kernels and a sort).

The k experts are found by k rounds of argmax over the token's probabilities held in registers
(k ≤ 16, E ≤ 1024), so ids come out by decreasing probability, ties to the lower expert id. A
token's result depends on its own logits only (batch invariance)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import interpreted

MAX_EXPERTS, MAX_TOP_K = 1024, 16


@triton.jit
def _router_kernel(logits_ptr, ids_ptr, w_ptr, stride_l, E, K: tl.constexpr, RENORMALIZE: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ok = cols < E
    z = tl.load(logits_ptr + row * stride_l + cols, mask=ok, other=float("-inf")).to(tl.float32)
    p = tl.exp(z - tl.max(z, axis=0))
    p = p / tl.sum(p, axis=0)
    p = tl.where(ok, p, -1.0)
    slots = tl.arange(0, BLOCK_K)
    chosen_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    chosen_i = tl.zeros([BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(K):
        best = tl.max(p, axis=0)
        index = tl.min(tl.where(p == best, cols, BLOCK_E), axis=0)
        chosen_w = tl.where(slots == j, best, chosen_w)
        chosen_i = tl.where(slots == j, index.to(tl.int64), chosen_i)
        p = tl.where(cols == index, -1.0, p)
    if RENORMALIZE:
        chosen_w = chosen_w / tl.sum(chosen_w, axis=0)
    keep = slots < K
    tl.store(ids_ptr + row * K + slots, chosen_i, mask=keep)
    tl.store(w_ptr + row * K + slots, chosen_w.to(w_ptr.dtype.element_ty), mask=keep)


def router_topk(logits: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """As `reference.router_topk`: logits [N, E] → ids [N, k] (long), weights [N, k] in `dtype`."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"router_topk: logits must be [N, E] and contiguous in E, got {tuple(logits.shape)} "
                         f"with strides {logits.stride()}")
    n, e = logits.shape
    if not 1 <= top_k <= min(e, MAX_TOP_K) or e > MAX_EXPERTS:
        raise ValueError(f"router_topk: top-{top_k} of {e} experts (k ≤ {MAX_TOP_K}, E ≤ {MAX_EXPERTS})")
    if logits.device.type != "cuda" and not interpreted():
        raise ValueError(f"router_topk: tensors are on {logits.device}; the Triton kernel needs CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")
    ids = torch.empty(n, top_k, dtype=torch.long, device=logits.device)
    weights = torch.empty(n, top_k, dtype=dtype, device=logits.device)
    if n:
        _router_kernel[(n,)](logits, ids, weights, logits.stride(0), e, K=top_k, RENORMALIZE=bool(renormalize),
                             BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k))
    return ids, weights
