"""Triton preparation of an attention pass (`reference.norm_rope_store`) in one launch: per
(token, head) program the query's or key's RMS norm (offset or plain) and partial RoPE with the
tables' row p + t (each step rounded to the activation dtype where the reference rounds), the keys
and values stored into the cache at position p + t, p read on the device."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.attention.reference import check_prepare_args
from hybridspec.kernels.interpreter import check_device
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _normed(x, inv, w, OFFSET: tl.constexpr, dtype: tl.constexpr):
    """x · inv · (1 + w) rounded to `dtype` (offset norm), or w · (x · inv rounded to `dtype`) rounded
    to `dtype` (plain norm), as fp32."""
    if OFFSET:
        y = (x * inv * (1.0 + w)).to(dtype)
    else:
        y = (w * (x * inv).to(dtype).to(tl.float32)).to(dtype)
    return y.to(tl.float32)


@triton.jit
def _norm_rope(src, w_ptr, cos_ptr, sin_ptr, eps, D, ROT: tl.constexpr, BD: tl.constexpr, OFFSET: tl.constexpr,
               dtype: tl.constexpr):
    """One head's row at `src` → RMS norm (`_normed`), then RoPE on its first ROT features
    (x·cos + rotate_half(x)·sin, each product and the sum rounded to `dtype`) [BD]."""
    o_d = tl.arange(0, BD)
    ok = o_d < D
    x = tl.load(src + o_d, mask=ok, other=0.0).to(tl.float32)
    inv = tl.rsqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + o_d, mask=ok, other=0.0).to(tl.float32)
    y = _normed(x, inv, w, OFFSET, dtype)
    rot = o_d < ROT
    low = o_d < ROT // 2
    partner = tl.where(low, o_d + ROT // 2, o_d - ROT // 2)  # rotate_half's source feature
    xp = tl.load(src + partner, mask=rot, other=0.0).to(tl.float32)
    wp = tl.load(w_ptr + partner, mask=rot, other=0.0).to(tl.float32)
    yp = _normed(xp, inv, wp, OFFSET, dtype)
    yp = tl.where(low, -yp, yp)
    c = tl.load(cos_ptr + o_d, mask=rot, other=1.0).to(tl.float32)
    s = tl.load(sin_ptr + o_d, mask=rot, other=0.0).to(tl.float32)
    roped = ((y * c).to(dtype).to(tl.float32) + (yp * s).to(dtype).to(tl.float32)).to(dtype)
    return tl.where(rot, roped, y.to(dtype))


@triton.jit
def _norm_rope_store_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, key_ptr, value_ptr, pos_ptr,
                            out_ptr, stride_qb, stride_qt, stride_qh, stride_kb, stride_kt, stride_kh,
                            stride_vb, stride_vt, stride_vh, stride_ct, stride_st, stride_cb, stride_cs,
                            stride_ch, stride_xb, stride_xs, stride_xh, T, S, P, eps,
                            H: tl.constexpr, D: tl.constexpr, ROT: tl.constexpr, BD: tl.constexpr,
                            OFFSET: tl.constexpr, USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_bt, j = tl.program_id(0), tl.program_id(1)  # (b, t); query head j < H, else KV head j − H
    b, t = (i_bt // T).to(tl.int64), i_bt % T  # b·stride of a long cache passes 2^31
    dtype = out_ptr.dtype.element_ty
    o_d = tl.arange(0, BD)
    ok = o_d < D
    slot = tl.load(pos_ptr) + t  # the token's position: its row of the tables and its slot in the cache
    row = tl.minimum(slot, P - 1)  # a position past the tables (and the cache) is never stored
    cos_row, sin_row = cos_ptr + row * stride_ct, sin_ptr + row * stride_st
    if j < H:
        y = _norm_rope(q_ptr + b * stride_qb + t * stride_qt + j * stride_qh, qw_ptr, cos_row, sin_row, eps, D,
                       ROT, BD, OFFSET, dtype)
        tl.store(out_ptr + ((b * T + t) * H + j) * D + o_d, y, mask=ok)
    else:
        kh = j - H
        into = ok & (o_d * 0 + slot < S)  # a position past the cache is never written
        y = _norm_rope(k_ptr + b * stride_kb + t * stride_kt + kh * stride_kh, kw_ptr, cos_row, sin_row, eps, D,
                       ROT, BD, OFFSET, dtype)
        tl.store(key_ptr + b * stride_cb + slot * stride_cs + kh * stride_ch + o_d, y, mask=into)
        x = tl.load(v_ptr + b * stride_vb + t * stride_vt + kh * stride_vh + o_d, mask=ok, other=0.0)
        tl.store(value_ptr + b * stride_xb + slot * stride_xs + kh * stride_xh + o_d, x, mask=into)


def norm_rope_store(q: Tensor, k: Tensor, v: Tensor, q_weight: Tensor, k_weight: Tensor, eps: float,
                    cos: Tensor, sin: Tensor, key: Tensor, value: Tensor, position: Tensor, offset: bool = True
                    ) -> Tensor:
    """`reference.norm_rope_store` in one launch over (B·T, H + H_kv) programs; rows must be
    contiguous in their last dimension (the heads of q, k and v may be strided views)."""
    check_prepare_args(q, k, v, q_weight, k_weight, cos, sin, key, value, position, offset)
    for name, t in (("q", q), ("k", k), ("v", v), ("q_weight", q_weight), ("k_weight", k_weight), ("cos", cos),
                    ("sin", sin), ("key", key), ("value", value)):
        if t.stride(-1) != 1:
            raise ValueError(f"norm_rope_store: {name} must be contiguous in its last dimension (stride {t.stride()})")
    check_device("norm_rope_store", q=q, k=k, v=v, q_weight=q_weight, k_weight=k_weight, cos=cos, sin=sin, key=key,
                 value=value, position=position)
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
            T, key.shape[1], cos.shape[0], eps, H=H, D=D, ROT=cos.shape[1], BD=triton.next_power_of_2(D),
            OFFSET=offset, num_warps=2 if D > 128 else 1, **pdl.options(q))
    return out
