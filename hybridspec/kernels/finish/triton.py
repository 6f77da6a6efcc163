"""`reference.finish_round` in one single-program launch.

Greedy acceptance takes the first row i < w − 1 whose draft differs from the target's argmax
(A = w − 1 where none does), as the reference's prefix product of matches counts; everything else
is copies and one subtraction, so the outputs equal the reference's exactly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.interpreter import check_device


@triton.jit
def _finish_round_kernel(drafts_ptr, y_ptr, accepted_ptr, x_new_ptr, w0_ptr, w_c_ptr, w_ptr, conf_ptr, ent_ptr,
                         ids_ptr, report_ptr, anchor_ptr, remaining_ptr, m_ptr, w, U,
                         D: tl.constexpr, K: tl.constexpr, GREEDY: tl.constexpr, BW: tl.constexpr,
                         BK: tl.constexpr):
    W = D + 1
    o_w = tl.arange(0, BW)
    d = tl.load(drafts_ptr + o_w, mask=o_w < D, other=0)  # [BW] d1 … dD
    if GREEDY:
        y = tl.load(y_ptr + o_w, mask=o_w < w, other=0)  # [BW] the target's argmax per row
        tested = o_w < w - 1
        accepted = tl.min(tl.where(tested & (d != y), o_w, w - 1), axis=0)  # the first mismatch, else w − 1
        x_new = tl.sum(tl.where(o_w == accepted, y, tl.zeros_like(y)), axis=0)
    else:
        accepted = tl.load(accepted_ptr)
        x_new = tl.load(x_new_ptr)
    m = accepted + 1
    tl.store(m_ptr, m)
    tl.store(anchor_ptr, x_new)
    tl.store(remaining_ptr, tl.load(remaining_ptr) - m)
    tl.store(report_ptr, m.to(tl.float32))
    tl.store(report_ptr + 1, tl.load(w0_ptr).to(tl.float32))
    tl.store(report_ptr + 2, tl.load(w_c_ptr).to(tl.float32))
    tl.store(report_ptr + 3, tl.load(w_ptr).to(tl.float32))
    emitted = tl.where(o_w < accepted, d, x_new)  # d1 … dA, then x_new
    tl.store(report_ptr + 4 + o_w, emitted.to(tl.float32), mask=o_w < W)
    p_d = report_ptr + 4 + W
    tl.store(p_d + o_w, d.to(tl.float32), mask=o_w < D)
    tl.store(p_d + D + o_w, tl.load(conf_ptr + o_w, mask=o_w < D, other=0.0), mask=o_w < D)
    tl.store(p_d + 2 * D + o_w, tl.load(ent_ptr + o_w, mask=o_w < D, other=0.0), mask=o_w < D)
    o_k = tl.arange(0, BK)
    slot = o_w[:, None] * K + o_k[None, :]  # [BW, BK]
    row_ok = (o_w < W)[:, None] & (o_k < K)[None, :]
    ids = tl.load(ids_ptr + slot, mask=(o_w < U)[:, None] & (o_k < K)[None, :], other=-1)
    tl.store(p_d + 3 * D + slot, ids.to(tl.float32), mask=row_ok)


def finish_round(drafts: Tensor, w: int, y: Tensor | None, accepted: Tensor | None, x_new: Tensor | None,
                 lengths: tuple[Tensor, Tensor, Tensor], confidence: Tensor, entropy: Tensor, layer0: Tensor,
                 report: Tensor, anchor: Tensor, remaining: Tensor, m: Tensor) -> None:
    """`reference.finish_round` (same arguments and outputs) in one launch."""
    fn = "finish_round"
    D = drafts.shape[0]
    U, K = layer0.shape
    if (y is None) == (accepted is None) or (accepted is None) != (x_new is None):
        raise ValueError(f"{fn}: give y (greedy) or accepted and x_new (sampled), not both")
    if not 2 <= w <= D + 1 or not 0 < U <= D + 1:
        raise ValueError(f"{fn}: w = {w} and Layer-0 rows U = {U} must be in 2..{D + 1} and 1..{D + 1}")
    longs = dict(drafts=drafts, y=y, accepted=accepted, x_new=x_new, w0=lengths[0], w_c=lengths[1], w=lengths[2],
                 layer0=layer0, anchor=anchor, remaining=remaining, m=m)
    sizes = dict(drafts=D, y=w, accepted=1, x_new=1, w0=1, w_c=1, w=1, anchor=1, remaining=1, m=1)
    for name, t in longs.items():
        if t is None:
            continue
        if t.dtype != torch.long or not t.is_contiguous() or (name in sizes and t.numel() < sizes[name]):
            raise ValueError(f"{fn}: {name} must be contiguous long with at least {sizes.get(name, U * K)} "
                             f"values, got {t.dtype} {tuple(t.shape)} with strides {t.stride()}")
    for name, t, size in (("confidence", confidence, D), ("entropy", entropy, D),
                          ("report", report, 4 + (D + 1) + 3 * D + (D + 1) * K)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != size:
            raise ValueError(f"{fn}: {name} must be contiguous fp32 with {size} values, got {t.dtype} "
                             f"{tuple(t.shape)}")
    check_device(fn, **longs, confidence=confidence, entropy=entropy, report=report)
    greedy = y is not None
    _finish_round_kernel[(1,)](drafts, y if greedy else drafts, accepted if not greedy else drafts,
                               x_new if not greedy else drafts, *lengths, confidence, entropy, layer0, report,
                               anchor, remaining, m, w, U, D=D, K=K, GREEDY=greedy,
                               BW=triton.next_power_of_2(D + 1), BK=triton.next_power_of_2(K), num_warps=1)
