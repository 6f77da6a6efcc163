"""Gated attention over the static KV cache in two launches, with `reference.py`'s signature.

1. Split: grid (B·H_kv, row blocks, splits). The rows of a KV head are its G = H / H_kv query heads
   times the T tokens (row r: token r // G, head kv·G + r % G), so a pass of T tokens reads each
   key and value once per row block. Split s covers the keys [s·CH, (s + 1)·CH) up to the context
   p + T, p read from `position` on the device; it keeps an online softmax over blocks of BN keys
   and stores its unnormalised output, running maximum and sum (fp32). Splits past the context
   return at once.
2. Combine: one program per (batch, token, head) sums the live splits in split order, divides,
   rounds to the activation dtype and multiplies by sigmoid(gate) (rounded as the reference rounds).

The grid depends only on (B, T, S) and the device, never on the context length, so the call can be
captured in a CUDA graph and replayed at every length; the sum's order is fixed, so the result is
bitwise repeatable (no atomics), and equal whether the host knows the length or not.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels.attention.reference import check_attention_args
from hybridspec.kernels.interpreter import interpreted

LOG2E = 1.4426950408889634


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr,
                       stride_qb, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                       stride_vh, T, S, CH, SPLITS, ROWS, qk_scale,
                       G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    i_bh, i_r, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kh = i_bh // HKV, i_bh % HKV
    p = tl.load(pos_ptr)
    hi = tl.minimum(p + T, S)  # keys [0, hi) are the context of the last token
    start = i_s * CH
    if start < hi:
        o_r = i_r * BM + tl.arange(0, BM)
        r_ok = o_r < T * G
        t = o_r // G
        h = kh * G + o_r % G
        o_d = tl.arange(0, BD)
        d_ok = o_d < D
        b_q = tl.load(q_ptr + b * stride_qb + t[:, None] * stride_qt + h[:, None] * stride_qh + o_d[None, :],
                      mask=r_ok[:, None] & d_ok[None, :], other=0.0)  # [BM, BD]
        if WIDEN:
            b_q = b_q.to(tl.float32)
        last = p + t  # [BM] the last key each row sees
        m_i = tl.full([BM], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BM], dtype=tl.float32)
        acc = tl.zeros([BM, BD], dtype=tl.float32)
        stop = tl.minimum(start + CH, hi)
        for n0 in range(start, stop, BN):
            o_n = n0 + tl.arange(0, BN)
            n_ok = o_n < stop
            kv_ok = n_ok[:, None] & d_ok[None, :]
            b_k = tl.load(k_ptr + b * stride_kb + o_n[:, None] * stride_ks + kh * stride_kh + o_d[None, :],
                          mask=kv_ok, other=0.0)  # [BN, BD]
            b_v = tl.load(v_ptr + b * stride_vb + o_n[:, None] * stride_vs + kh * stride_vh + o_d[None, :],
                          mask=kv_ok, other=0.0)
            if WIDEN:
                b_k, b_v = b_k.to(tl.float32), b_v.to(tl.float32)
            s = tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION) * qk_scale  # [BM, BN], log2 units
            s = tl.where((o_n[None, :] <= last[:, None]) & n_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that sees no key yet
            alpha = tl.exp2(m_i - m_safe)
            b_p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(b_p, 1)
            acc = acc * alpha[:, None] + tl.dot(b_p.to(b_v.dtype), b_v, input_precision=PRECISION)
            m_i = m_new
        base = (i_bh * SPLITS + i_s) * ROWS + o_r  # [BM] rows of this split's block in the workspace
        tl.store(acc_ptr + base[:, None] * BD + o_d[None, :], acc, mask=r_ok[:, None])
        tl.store(ml_ptr + base * 2, m_i, mask=r_ok)
        tl.store(ml_ptr + base * 2 + 1, l_i, mask=r_ok)


@triton.jit
def _attn_combine_kernel(acc_ptr, ml_ptr, gate_ptr, pos_ptr, out_ptr, stride_gb, stride_gt, stride_gh,
                         T, S, CH, SPLITS, ROWS, H: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                         BD: tl.constexpr):
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


@functools.cache
def _programs_wanted(device: torch.device) -> int:
    """Split programs to aim for: two per SM (a fixed 64 under the interpreter)."""
    if device.type != "cuda":
        return 64
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def layout(B: int, T: int, H: int, H_kv: int, D: int, S: int, element_size: int, device: torch.device) -> dict:
    """Tile sizes and the split of the S keys for a call (a function of the shapes and the device
    only: every context length of a cache runs the same grid)."""
    G = H // H_kv
    bm = min(64, max(16, triton.next_power_of_2(T * G)))
    bd = max(16, triton.next_power_of_2(D))
    bn = 64 if element_size <= 2 and bd <= 256 else 32
    row_blocks = triton.cdiv(T * G, bm)
    splits = max(1, min(triton.cdiv(S, bn), triton.cdiv(_programs_wanted(device), B * H_kv * row_blocks)))
    ch = triton.cdiv(triton.cdiv(S, splits), bn) * bn
    return dict(G=G, BM=bm, BD=bd, BN=bn, row_blocks=row_blocks, splits=triton.cdiv(S, ch), CH=ch,
                warps=8 if bm * bd >= 64 * 256 else 4)


def gated_attention(q: Tensor, gate: Tensor, key: Tensor, value: Tensor, position: Tensor,
                    span: int | None = None) -> Tensor:
    """`reference.gated_attention`; `span` is accepted for the same signature and not needed: the
    keys past position[0] + T are masked on the device."""
    check_attention_args(q, gate, key, value, position)
    for name, t in (("q", q), ("gate", gate), ("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"attention: {name} must be contiguous in its last dimension (stride {t.stride()})")
    B, T, H, D = q.shape
    S, H_kv = key.shape[1], key.shape[2]
    lay = layout(B, T, H, H_kv, D, S, q.element_size(), q.device)
    rows = lay["row_blocks"] * lay["BM"]
    acc = torch.empty((B * H_kv, lay["splits"], rows, lay["BD"]), dtype=torch.float32, device=q.device)
    ml = torch.empty((B * H_kv, lay["splits"], rows, 2), dtype=torch.float32, device=q.device)
    out = torch.empty((B, T, H * D), dtype=q.dtype, device=q.device)
    widen = interpreted() and q.element_size() < 4
    _attn_split_kernel[(B * H_kv, lay["row_blocks"], lay["splits"])](
        q, key, value, position, acc, ml,
        q.stride(0), q.stride(1), q.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), T, S, lay["CH"], lay["splits"], rows,
        LOG2E / math.sqrt(D), G=lay["G"], HKV=H_kv, D=D, BD=lay["BD"], BM=lay["BM"], BN=lay["BN"],
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=lay["warps"], num_stages=2)
    _attn_combine_kernel[(B * T * H,)](
        acc, ml, gate, position, out, gate.stride(0), gate.stride(1), gate.stride(2),
        T, S, lay["CH"], lay["splits"], rows, H=H, G=lay["G"], D=D, BD=lay["BD"], num_warps=4 if D > 128 else 2)
    return out
