"""Gated attention over the static KV cache in two launches, with `reference.py`'s signature.

1. Split (`split.py`): grid (B·H_kv, row blocks, splits), the live context [0, p + T) divided
   among the splits (p read from `position` on the device), each split an online softmax over its
   keys.
2. Combine (`combine.py`): one program per (batch, token, head) sums the live splits in split
   order, divides, and multiplies by sigmoid(gate).

`block_attention` runs the same two launches for the drafter's block: no gate, every query seeing
the whole context [0, p + T) (not causal within the block).

`norm_rope_store` (`prepare.py`) prepares the pass before them in one launch: per (token, head)
program the query's or key's offset RMS norm and partial RoPE (each step rounded to the activation
dtype where the reference rounds), the keys and values stored into the cache at position p + t.

The grid depends only on (B, T, S) and the device, never on the context length, so the call can be
captured in a CUDA graph and replayed at every length. Each split's length is computed on the device
from p + T in whole key blocks, so the splits that have keys follow the context (all of them up to
one key block each, at least half beyond), however far the cache's S positions exceed it (a
server's context limit). The sum's order is fixed by p + T (no atomics): the result is bitwise
repeatable, and equal whether the host knows the length or not; a token's sum runs in another order
in a pass of w tokens than in a pass of one, as the products' and the MoE's kernels already do.
"""

from __future__ import annotations

import functools

import torch
import triton
from torch import Tensor

from hybridspec.kernels.attention.combine import launch_combine
from hybridspec.kernels.attention.prepare import norm_rope_store
from hybridspec.kernels.attention.reference import check_attention_args
from hybridspec.kernels.attention.split import launch_split
from hybridspec.kernels.interpreter import check_device, interpreted

__all__ = ["block_attention", "gated_attention", "layout", "norm_rope_store"]


@functools.cache
def _programs_wanted(device: torch.device) -> int:
    """Split programs to aim for: two per SM (a fixed 64 under the interpreter)."""
    if device.type != "cuda":
        return 64
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def layout(B: int, T: int, H: int, H_kv: int, D: int, S: int, element_size: int, device: torch.device) -> dict:
    """Tile sizes and the number of splits for a call (a function of the shapes and the device only:
    every context length of a cache runs the same grid). BN, the keys of one online-softmax step: 64
    for 16-bit entries up to D = 256, else 32."""
    G = H // H_kv
    bm = min(64, max(16, triton.next_power_of_2(T * G)))
    bd = max(16, triton.next_power_of_2(D))
    bn = 64 if element_size <= 2 and bd <= 256 else 32
    row_blocks = triton.cdiv(T * G, bm)
    splits = max(1, min(triton.cdiv(S, bn), triton.cdiv(_programs_wanted(device), B * H_kv * row_blocks)))
    return dict(H=H, D=D, G=G, BM=bm, BD=bd, BN=bn, row_blocks=row_blocks, splits=splits,
                warps=8 if bm * bd >= 64 * 256 else 4)


def gated_attention(q: Tensor, gate: Tensor, key: Tensor, value: Tensor, position: Tensor,
                    span: int | None = None) -> Tensor:
    """`reference.gated_attention`; `span` is accepted for the same signature and not needed: the
    keys past position[0] + T are masked on the device."""
    check_attention_args(q, gate, key, value, position)
    return _attention(q, gate, key, value, position, causal=True)


def block_attention(q: Tensor, key: Tensor, value: Tensor, position: Tensor, span: int | None = None) -> Tensor:
    """`reference.block_attention` (the drafter's: every query sees [0, p + T), no gate); `span` as in
    `gated_attention`."""
    check_attention_args(q, q, key, value, position)
    return _attention(q, None, key, value, position, causal=False)


def _attention(q: Tensor, gate: Tensor | None, key: Tensor, value: Tensor, position: Tensor, causal: bool) -> Tensor:
    for name, t in (("q", q), ("gate", gate), ("key", key), ("value", value)):
        if t is not None and t.stride(-1) != 1:
            raise ValueError(f"attention: {name} must be contiguous in its last dimension (stride {t.stride()})")
    check_device("attention", q=q, gate=gate, key=key, value=value, position=position)
    if not (q.dtype == key.dtype == value.dtype) or (gate is not None and gate.dtype != q.dtype):
        raise ValueError(f"attention: q {q.dtype}, key {key.dtype}, value {value.dtype} and gate must share a dtype")
    B, T, H, D = q.shape
    S, H_kv = key.shape[1], key.shape[2]
    lay = layout(B, T, H, H_kv, D, S, q.element_size(), q.device)
    rows = lay["row_blocks"] * lay["BM"]
    acc = torch.empty((B * H_kv, lay["splits"], rows, lay["BD"]), dtype=torch.float32, device=q.device)
    ml = torch.empty((B * H_kv, lay["splits"], rows, 2), dtype=torch.float32, device=q.device)
    out = torch.empty((B, T, H * D), dtype=q.dtype, device=q.device)
    widen = interpreted() and q.element_size() < 4
    launch_split(q, key, value, position, acc, ml, lay, widen, causal)
    launch_combine(acc, ml, gate, position, out, S, lay)
    return out
