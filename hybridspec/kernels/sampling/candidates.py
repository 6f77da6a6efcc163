"""Each block's top-k logits, the first step of filtered sampling (`filtered.py`).

Grid (w, ceil(V / BV)): program (i, b) reads logits[i, b·BV : (b+1)·BV] once, scaled by
1 / temperature (z), and stores its k largest values by decreasing value (ties to the lower id)
with their token ids, k read from the device (clamped to 1 … KMAX). Any token of row i's top k is among its
block's top k, so the row's top k are among the blocks' candidates.

    logits [w, V]   inv_temperature [1]   top_k [1]   → values [w, blocks, KMAX] fp32, ids [w, blocks, KMAX] int32
    (entries j ≥ k left unwritten)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.sampling import KERNEL_TOP_K as KMAX


@triton.jit
def _top_k_candidates_kernel(logits_ptr, inv_t_ptr, top_k_ptr, value_ptr, id_ptr, stride_l, V, NB,
                             KMAX: tl.constexpr, BV: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_w, i_b = tl.program_id(0), tl.program_id(1)
    k = tl.minimum(tl.maximum(tl.load(top_k_ptr).to(tl.int32), 1), KMAX)
    o_v = i_b * BV + tl.arange(0, BV)
    z = tl.load(logits_ptr + i_w * stride_l + o_v, mask=o_v < V, other=float("-inf")).to(tl.float32)
    z = z * tl.load(inv_t_ptr).to(tl.float32)  # [BV]
    p_out = (i_w * NB + i_b) * KMAX
    for j in range(0, k):
        best = tl.max(z, 0)
        winner = tl.min(tl.where(z == best, o_v, V + BV), 0)  # ties to the lower id
        tl.store(value_ptr + p_out + j, best)
        tl.store(id_ptr + p_out + j, winner)
        z = tl.where(o_v == winner, float("-inf"), z)


def launch_candidates(logits, inv_temperature, top_k, values, ids, block_v: int) -> None:
    """logits [w, V] (unit column stride), inv_temperature and top_k [1] → values, ids
    [w, ceil(V / block_v), KMAX] (written for j < top_k)."""
    w, V = logits.shape
    nb = triton.cdiv(V, block_v)
    if logits.stride(1) != 1:
        raise ValueError(f"launch_candidates: logits must have unit column stride, got {logits.stride()}")
    for name, t, dtype in (("values", values, torch.float32), ("ids", ids, torch.int32)):
        if tuple(t.shape) != (w, nb, KMAX) or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"launch_candidates: {name} must be contiguous {dtype} [w, blocks, KMAX] = "
                             f"{(w, nb, KMAX)}, got {t.dtype} {tuple(t.shape)} with strides {t.stride()}")
    _top_k_candidates_kernel[(w, nb)](logits, inv_temperature, top_k, values, ids, logits.stride(0), V, nb,
                                      KMAX=KMAX, BV=block_v, num_warps=8, **pdl.options(logits))
