"""Jit helpers of the norm kernels."""

import triton
import triton.language as tl


@triton.jit
def gated_rms(x, g, w, N, eps, DTYPE: tl.constexpr):
    """weight · normalize(x) · silu(g) over the rows x and g (N values each; masked entries 0),
    rounded where `reference.gated_rms_norm` rounds for a weight w in DTYPE (as the loaders store
    it): x to DTYPE first, the normalized value and its product with w to DTYPE, the result to
    DTYPE."""
    xf = x.to(DTYPE).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=0) / N + eps)
    y = (w.to(tl.float32) * (xf * inv).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    gf = g.to(tl.float32)
    return (y * (gf / (1.0 + tl.exp(-gf)))).to(DTYPE)
