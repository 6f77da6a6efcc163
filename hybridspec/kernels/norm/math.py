"""The norms' arithmetic as `@triton.jit` helpers, shared by the norm kernels (`offset.py`,
`gated.py`) and by the products that normalise their own input rows (`kernels/linear/rows.py`,
`kernels/linear/rows_gated.py`, `kernels/moe/router_rows.py`). Each rounds where
`reference.py` rounds; masked entries must be 0."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def residual_sum(x, r, DTYPE: tl.constexpr):
    """s = x + r as torch adds two tensors of DTYPE: in fp32, rounded to DTYPE."""
    return (x.to(tl.float32) + r.to(tl.float32)).to(DTYPE)


@triton.jit
def offset_rms(s, w, N, eps, DTYPE: tl.constexpr):
    """normalize(s) · (1 + w) over the last axis of s (N values; rows [..., NP] or one row [NP]),
    rounded to DTYPE: fp32 statistics, w zero-centred."""
    sf = s.to(tl.float32)
    inv = tl.rsqrt(tl.sum(sf * sf, axis=len(sf.shape) - 1, keep_dims=True) / N + eps)
    return (sf * inv * (1.0 + w.to(tl.float32))).to(DTYPE)


@triton.jit
def gated_rms(x, g, w, N, eps, DTYPE: tl.constexpr):
    """weight · normalize(x) · silu(g) over the last axis of x (N values; rows [..., NP] or one row
    [NP]) and its gate g, rounded where `reference.gated_rms_norm` rounds for a weight w in DTYPE
    (as the loaders store it): x to DTYPE first, the normalized value and its product with w to
    DTYPE, the result to DTYPE."""
    xf = x.to(DTYPE).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=len(xf.shape) - 1, keep_dims=True) / N + eps)
    y = (w.to(tl.float32) * (xf * inv).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    gf = g.to(tl.float32)
    return (y * (gf / (1.0 + tl.exp(-gf)))).to(DTYPE)
