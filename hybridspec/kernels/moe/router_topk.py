"""Triton top-k of given router logits: softmax over the experts, the top k by decreasing
probability (ties to the lower expert id), renormalized when asked; one program per token, so a
token's result depends on its own logits only (batch invariance). Same signature and result as
`reference.router_topk`; `router.py` takes it after the library's product for the calls its one
launch does not take (prefill chunks, routers of more than 256 experts)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.moe.tiles import softmax_top_k

MAX_EXPERTS, MAX_TOP_K = 1024, 16


@triton.jit
def _router_kernel(logits_ptr, ids_ptr, w_ptr, stride_l, E, K: tl.constexpr, RENORMALIZE: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_E)
    ok = cols < E
    z = tl.load(logits_ptr + row * stride_l + cols, mask=ok, other=float("-inf")).to(tl.float32)
    chosen_w, chosen_i = softmax_top_k(z[None, :], ok, K, RENORMALIZE, BLOCK_E, BLOCK_K)  # [1, BLOCK_K]
    slots = tl.arange(0, BLOCK_K)
    keep = (slots < K)[None, :]
    tl.store(ids_ptr + row * K + slots[None, :], chosen_i, mask=keep)
    tl.store(w_ptr + row * K + slots[None, :], chosen_w.to(w_ptr.dtype.element_ty), mask=keep)


def check_top_k(name: str, experts: int, top_k: int, device: torch.device) -> None:
    """ValueError naming what a top-k of `experts` on `device` cannot take: k outside 1 … min(E,
    MAX_TOP_K), more than MAX_EXPERTS experts, or CPU tensors without the interpreter."""
    if not 1 <= top_k <= min(experts, MAX_TOP_K) or experts > MAX_EXPERTS:
        raise ValueError(f"{name}: top-{top_k} of {experts} experts (k ≤ {MAX_TOP_K}, E ≤ {MAX_EXPERTS})")
    if device.type != "cuda" and not interpreted():
        raise ValueError(f"{name}: tensors are on {device}; the Triton kernel needs CUDA tensors "
                         "(CPU tensors only with TRITON_INTERPRET=1 set before import)")


def router_topk(logits: Tensor, top_k: int, renormalize: bool, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """As `reference.router_topk`: logits [N, E] → ids [N, k] (long), weights [N, k] in `dtype`."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"router_topk: logits must be [N, E] and contiguous in E, got {tuple(logits.shape)} "
                         f"with strides {logits.stride()}")
    n, e = logits.shape
    check_top_k("router_topk", e, top_k, logits.device)
    ids = torch.empty(n, top_k, dtype=torch.long, device=logits.device)
    weights = torch.empty(n, top_k, dtype=dtype, device=logits.device)
    if n:
        _router_kernel[(n,)](logits, ids, weights, logits.stride(0), e, K=top_k, RENORMALIZE=bool(renormalize),
                             BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k))
    return ids, weights
