"""Split step of the gated attention (`triton.py`): grid (B·H_kv, row blocks, splits). The rows
of a KV head are its G = H / H_kv query heads times the T tokens (row r: token r // G, head
kv·G + r % G), so a pass of T tokens reads each key and value once per row block. Split s covers
the keys [s·CH, (s + 1)·CH) of the context [0, p + T), p read from `position` on the device and
CH = cdiv(cdiv(p + T, SPLITS), BN)·BN (the live context divided among the splits); it keeps an
online softmax over blocks of BN keys and stores its unnormalised output, running maximum and sum
(fp32). Splits past the context return at once. CAUSAL: token t sees the keys up to p + t; else
every token sees the whole context [0, p + T) (the drafter's block)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release

LOG2E = 1.4426950408889634


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr,
                       stride_qb, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                       stride_vh, T, S, SPLITS, ROWS, qk_scale,
                       G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr,
                       CAUSAL: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_bh, i_r, i_s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, kh = (i_bh // HKV).to(tl.int64), i_bh % HKV  # b·stride of a long cache passes 2^31
    p = tl.load(pos_ptr)
    hi = tl.minimum(p + T, S)  # keys [0, hi) are the context of the last token
    CH = tl.cdiv(tl.cdiv(hi, SPLITS), BN) * BN  # keys per split
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
        if CAUSAL:
            last = p + t  # [BM] the last key each row sees
        else:
            last = tl.zeros_like(t) + hi - 1
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


def launch_split(q: Tensor, key: Tensor, value: Tensor, position: Tensor, acc: Tensor, ml: Tensor, lay: dict,
                 widen: bool, causal: bool) -> None:
    """q [B, T, H, D], the cache's key / value [B, S, H_kv, D], position [≥ 1] long (on the device) →
    acc [B·H_kv, splits, rows, BD] and ml [B·H_kv, splits, rows, 2] (fp32, written); lay: `triton.layout`."""
    B, T, H, D = q.shape
    S, H_kv = key.shape[1], key.shape[2]
    rows = lay["row_blocks"] * lay["BM"]
    _attn_split_kernel[(B * H_kv, lay["row_blocks"], lay["splits"])](
        q, key, value, position, acc, ml,
        q.stride(0), q.stride(1), q.stride(2), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), T, S, lay["splits"], rows,
        LOG2E / math.sqrt(D), G=lay["G"], HKV=H_kv, D=D, BD=lay["BD"], BM=lay["BM"], BN=lay["BN"],
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", WIDEN=widen,
        CAUSAL=causal, num_warps=lay["warps"], num_stages=2, **pdl.options(q))
