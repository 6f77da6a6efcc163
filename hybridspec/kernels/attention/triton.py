"""Gated attention over the static KV cache in two launches, with `reference.py`'s signature.

1. Split: grid (B·H_kv, row blocks, splits). The rows of a KV head are its G = H / H_kv query heads
   times the T tokens (row r: token r // G, head kv·G + r % G), so a pass of T tokens reads each
   key and value once per row block. Split s covers the keys [s·CH, (s + 1)·CH) up to the context
   p + T, p read from `position` on the device; it keeps an online softmax over blocks of BN keys
   and stores its unnormalised output, running maximum and sum (fp32). Splits past the context
   return at once.
2. Combine: one program per (batch, token, head) sums the live splits in split order, divides,
   rounds to the activation dtype and multiplies by sigmoid(gate) (rounded as the reference rounds).

`norm_rope_store` prepares the pass before them in one launch: per (token, head) program the
query's or key's offset RMS norm and partial RoPE (each step rounded to the activation dtype where
the reference rounds), the keys and values stored into the cache at position p + t.

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

from hybridspec.kernels import pdl
from hybridspec.kernels.attention.reference import check_attention_args, check_prepare_args
from hybridspec.kernels.interpreter import interpreted
from hybridspec.kernels.pdl import wait_then_release

LOG2E = 1.4426950408889634


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr,
                       stride_qb, stride_qt, stride_qh, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                       stride_vh, T, S, CH, SPLITS, ROWS, qk_scale,
                       G: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr,
                       BN: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
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


@triton.jit
def _norm_rope(src, w_ptr, cos_ptr, sin_ptr, eps, D, ROT: tl.constexpr, BD: tl.constexpr, dtype: tl.constexpr):
    """One head's row at `src` → offset RMS norm, rounded to `dtype`, then RoPE on its first ROT
    features (x·cos + rotate_half(x)·sin, each product and the sum rounded to `dtype`) [BD]."""
    o_d = tl.arange(0, BD)
    ok = o_d < D
    x = tl.load(src + o_d, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + o_d, mask=ok, other=0.0).to(tl.float32)
    y = (x * inv * (1.0 + w)).to(dtype).to(tl.float32)
    rot = o_d < ROT
    low = o_d < ROT // 2
    partner = tl.where(low, o_d + ROT // 2, o_d - ROT // 2)  # rotate_half's source feature
    xp = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    yp = (xp * inv * (1.0 + wp)).to(dtype).to(tl.float32)
    yp = tl.where(low, -yp, yp)
    c = tl.load(cos_ptr + o_d, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + o_d, mask=rot, other=0.0).to(tl.float32)
    roped = ((y * c).to(dtype).to(tl.float32) + (yp * s).to(dtype).to(tl.float32)).to(dtype)
    return tl.where(rot, roped, y.to(dtype))


@triton.jit
def _norm_rope_store_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, key_ptr, value_ptr, pos_ptr,
                            out_ptr, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                            stride_vb, stride_vt, stride_vh, stride_ct, stride_st, stride_cb, stride_cs,
                            stride_ch, stride_xb, stride_xs, stride_xh, T, S, eps,
                            H: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, BD: tl.constexpr,
                            USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_bt, j = tl.program_id(0), tl.program_id(1)  # (b, t); query head j < H, else KV head j − H
    b, t = i_bt // T, i_bt % T
    dtype = out_ptr.dtype.element_ty
    o_d = tl.arange(0, BD)
    ok = o_d < D
    cos_row, sin_row = cos_ptr + t * stride_ct, sin_ptr + t * stride_st
    if j < H:
        y = _norm_rope(q_ptr + b * stride_qb + t * stride_qt + j * stride_qh, qw_ptr, cos_row, sin_row, eps, D,
                       ROT, BD, dtype)
        tl.store(out_ptr + ((b * T + t) * H + j) * D + o_d, y, mask=ok)
    else:
        kh = j - H
        slot = tl.load(pos_ptr) + t
        into = ok & (o_d * 0 + slot < S)  # a position past the cache is never written
        y = _norm_rope(k_ptr + b * stride_kb + t * stride_kt + kh * stride_kh, kw_ptr, cos_row, sin_row, eps, D,
                       ROT, BD, dtype)
        tl.store(key_ptr + b * stride_cb + slot * stride_cs + kh * stride_ch + o_d, y, mask=into)
        x = tl.load(v_ptr + b * stride_vb + t * stride_vt + kh * stride_vh + o_d, mask=ok, other=0.0)
        tl.store(value_ptr + b * stride_xb + slot * stride_xs + kh * stride_xh + o_d, x, mask=into)


def norm_rope_store(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
                    cos: Tensor, sin: Tensor, key: Tensor, value: Tensor, position: Tensor) -> Tensor:
    """`reference.norm_rope_store` in one launch over (B·T, H + H_kv) programs; rows must be
    contiguous in their last dimension (the heads of q, k and v may be strided views)."""
    check_prepare_args(q, k, v, q_weight, k_weight, cos, sin, key, value, position)
    for name, t in (("q", q), ("k", k), ("v", v), ("cos", cos), ("sin", sin), ("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"norm_rope_store: {name} must be contiguous in its last dimension (stride {t.stride()})")
    if not (q.dtype == k.dtype == v.dtype == key.dtype == value.dtype):
        raise ValueError(f"norm_rope_store: q, k, v and the cache must share a dtype, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {key.dtype}, {value.dtype}")
    B, T, H, D = q.shape
    out = torch.empty((B, T, H, D), dtype=q.dtype, device=q.device)
    if B * T:
        _norm_rope_store_kernel[(B * T, H + k.shape[2])](
            q, k, v, q_weight, k_weight, cos, sin, key, value, position, out,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), cos.stride(0), sin.stride(0),
            key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
            T, key.shape[1], eps, H=H, D=D, ROT=cos.shape[1], BD=triton.next_power_of_2(D),
            num_warps=2 if D > 128 else 1, **pdl.options(q))
    return out


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
        num_warps=lay["warps"], num_stages=2, **pdl.options(q))
    _attn_combine_kernel[(B * T * H,)](
        acc, ml, gate, position, out, gate.stride(0), gate.stride(1), gate.stride(2),
        T, S, lay["CH"], lay["splits"], rows, H=H, G=lay["G"], D=D, BD=lay["BD"], num_warps=4 if D > 128 else 2,
        **pdl.options(q))
    return out
