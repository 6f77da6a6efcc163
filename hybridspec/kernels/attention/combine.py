"""Combine step of the gated attention (`triton.py`): one program per (batch, token, head) sums the
live splits, divides, rounds to the activation dtype and multiplies by sigmoid(gate) (rounded as
the reference rounds). The splits are read CHUNK at a time, each chunk's maxima, sums and rows in
one round of loads, and folded into the running sum by the online softmax's rescaling: at the
contexts where all live splits fit one chunk, a program waits on the L2 once, not once per split.
The sum's order is fixed by the layout and p + T (chunk by chunk, a tree within each), so a row's
result depends on nothing but its own splits. The splits' length is the split step's, computed
from the live context. Without GATED (the drafter's attention) the quotient is the output."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release

CHUNK = 32  # splits per round of loads (at most): [CHUNK, D] fp32 of partial rows in registers


@triton.jit
def _attn_combine_kernel(acc_ptr, ml_ptr, gate_ptr, pos_ptr, out_ptr, stride_gb, stride_gt, stride_gh,
                         T, S, SPLITS, ROWS, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                         BD: tl.constexpr, SC: tl.constexpr, BN: tl.constexpr,
                         GATED: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    row = tl.program_id(0)  # (b, t, h)
    b, t, h = row // (T * H), (row // H) % T, row % H
    kh, r = h // G, t * G + h % G
    p = tl.load(pos_ptr)
    hi = tl.minimum(p + T, S)
    CH = tl.cdiv(tl.cdiv(hi, SPLITS), BN) * BN  # keys per split, as the split step
    live = tl.cdiv(hi, CH)
    o_d = tl.arange(0, BD)
    d_ok = o_d < D
    base = ((b * (H // G) + kh) * SPLITS) * ROWS + r  # split 0's row of this (b, t, h)
    m = float("-inf")
    num = tl.zeros([BD], dtype=tl.float32)
    den = 0.0
    for c in range(0, live, SC):
        o_s = c + tl.arange(0, SC)
        s_ok = o_s < live
        p_ml = ml_ptr + (base + o_s * ROWS) * 2
        b_m = tl.load(p_ml, mask=s_ok, other=float("-inf"))  # [SC] running maxima (log2 units)
        b_l = tl.load(p_ml + 1, mask=s_ok, other=0.0)  # [SC] running sums
        b_acc = tl.load(acc_ptr + (base + o_s[:, None] * ROWS) * BD + o_d[None, :], mask=s_ok[:, None],
                        other=0.0)  # [SC, BD]
        m_new = tl.maximum(m, tl.max(b_m, 0))  # finite from the first chunk on: split 0 holds key 0
        w = tl.where(b_m == float("-inf"), 0.0, tl.exp2(b_m - m_new))  # [SC]
        scale = tl.exp2(m - m_new)  # 0 for the first chunk (m = −inf)
        num = num * scale + tl.sum(w[:, None] * b_acc, 0)
        den = den * scale + tl.sum(w * b_l, 0)
        m = m_new
    dtype = out_ptr.dtype.element_ty
    o = (num / den).to(dtype)
    if GATED:
        g = tl.load(gate_ptr + b * stride_gb + t * stride_gt + h * stride_gh + o_d, mask=d_ok, other=0.0)
        sig = (1.0 / (1.0 + tl.exp(-g.to(tl.float32)))).to(dtype).to(tl.float32)
        o = (o.to(tl.float32) * sig).to(dtype)
    tl.store(out_ptr + row * D + o_d, o, mask=d_ok)


def launch_combine(acc: Tensor, ml: Tensor, gate: Tensor | None, position: Tensor, out: Tensor, S: int,
                   lay: dict) -> None:
    """The split step's acc and ml for a cache of S positions, gate [B, T, H, D] (rows contiguous) or
    None (no gate), position [≥ 1] long (on the device) → out [B, T, H·D] (written); lay: `triton.layout`."""
    B, T = out.shape[:2]
    H, D = lay["H"], lay["D"]
    gated = gate is not None
    gate = gate if gated else out.view(B, T, H, D)  # an unread stand-in for the pointer
    rows = lay["row_blocks"] * lay["BM"]
    _attn_combine_kernel[(B * T * H,)](
        acc, ml, gate, position, out, gate.stride(0), gate.stride(1), gate.stride(2),
        T, S, lay["splits"], rows, H=H, G=lay["G"], D=D, BD=lay["BD"],
        SC=min(CHUNK, triton.next_power_of_2(lay["splits"])), BN=lay["BN"],
        GATED=gated, num_warps=4 if D > 128 else 2,
        **pdl.options(gate))
