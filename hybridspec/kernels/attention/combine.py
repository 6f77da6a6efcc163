"""Combine step of the gated attention (`triton.py`): one program per (batch, token, head) sums the
live splits in split order, divides, rounds to the activation dtype and multiplies by
sigmoid(gate) (rounded as the reference rounds)."""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _attn_combine_kernel(acc_ptr, ml_ptr, gate_ptr, pos_ptr, out_ptr, stride_gb, stride_gt, stride_gh,
                         T, S, CH, SPLITS, ROWS, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                         BD: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    row = tl.program_id(0)  # (b, t, h)
    b, t, h = row // (T * H), (row // H) % T, row % H
    kh, r = h // G, t * G + h % G
    p = tl.load(pos_ptr)
    live = tl.cdiv(tl.minimum(p + T, S), CH)
    o_d = tl.arange(0, BD)
    d_ok = o_d < D
    base = ((b * (H // G) + kh) * SPLITS) * ROWS + r  # split 0's row of this (b, t, h)
    m = float("-inf")
    for s in range(0, live):
        m = tl.maximum(m, tl.load(ml_ptr + (base + s * ROWS) * 2))
    num = tl.zeros([BD], dtype=tl.float32)
    den = 0.0
    for s in range(0, live):
        m_s = tl.load(ml_ptr + (base + s * ROWS) * 2)
        w = tl.where(m_s == float("-inf"), 0.0, tl.exp2(m_s - m))
        num += w * tl.load(acc_ptr + (base + s * ROWS) * BD + o_d)
        den += w * tl.load(ml_ptr + (base + s * ROWS) * 2 + 1)
    dtype = out_ptr.dtype.element_ty
    o = (num / den).to(dtype).to(tl.float32)
    g = tl.load(gate_ptr + b * stride_gb + t * stride_gt + h * stride_gh + o_d, mask=d_ok, other=0.0).to(tl.float32)
    sig = (1.0 / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * D + o_d, (o * sig).to(dtype), mask=d_ok)


def launch_combine(acc: Tensor, ml: Tensor, gate: Tensor, position: Tensor, out: Tensor, S: int, lay: dict) -> None:
    """The split step's acc and ml for a cache of S positions, gate [B, T, H, D] (rows contiguous),
    position [≥ 1] long (on the device) → out [B, T, H·D] (written); lay: `triton.layout`."""
    B, T, H, D = gate.shape
    rows = lay["row_blocks"] * lay["BM"]
    _attn_combine_kernel[(B * T * H,)](
        acc, ml, gate, position, out, gate.stride(0), gate.stride(1), gate.stride(2),
        T, S, lay["CH"], lay["splits"], rows, H=H, G=lay["G"], D=D, BD=lay["BD"], num_warps=4 if D > 128 else 2,
        **pdl.options(gate))
