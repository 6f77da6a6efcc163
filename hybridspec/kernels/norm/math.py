"""The offset norm's arithmetic as `@triton.jit` helpers, shared by the norm kernel (`offset.py`)
and by the register-slice router of one or two tokens, which normalises its input rows itself
(`kernels/moe/router_rows.py`).
Each rounds where `reference.py` rounds; masked entries must be 0."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def residual_sum(x, r, DTYPE: tl.constexpr):
    """s = x + r as torch adds two tensors of DTYPE: in fp32, rounded to DTYPE."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(DTYPE)


@triton.jit
def offset_rms(s, w, N, eps, DTYPE: tl.constexpr):
    """normalize(s) · (1 + w) of one row s [NP] (N values), rounded to DTYPE: fp32 statistics, w
    zero-centred."""
    sf = s.to(tl.float32)
    inv = tl.rsqrt(tl.sum(sf * sf, axis=0) / N + eps)
    return (sf * inv * (1.0 + w.to(tl.float32))).to(DTYPE)


@triton.jit
def plain_rms(s, w, N, eps, DTYPE: tl.constexpr):
    """w · normalize(s) of one row s [NP] (N values): fp32 statistics, the normalized value rounded to
    DTYPE, then its product with w rounded to DTYPE (`reference.rms_norm`)."""
    sf = s.to(tl.float32)
    inv = tl.rsqrt(tl.sum(sf * sf, axis=0) / N + eps)
    return (w.to(tl.float32) * (sf * inv).to(DTYPE).to(tl.float32)).to(DTYPE)
