"""Jit helpers of the norms shared by several kernels."""

import triton
import triton.language as tl


@triton.jit
def gated_rms(x, g, w, N, eps, AXIS: tl.constexpr, DTYPE: tl.constexpr):
    """weight · normalize(x) · silu(g) over axis AXIS of the tiles x and g (N values each; masked
    entries 0), rounded where `reference.gated_rms_norm` rounds for a weight w in DTYPE (as the
    loaders store it): x to DTYPE first, the normalized value and its product with w (a tile
    broadcast along the other axes) to DTYPE, the result to DTYPE."""
    xf = x.to(DTYPE).to(tl.float32)
    inv = tl.rsqrt(tl.sum(xf * xf, axis=AXIS) / N + eps)
    y = (w.to(tl.float32) * (xf * tl.expand_dims(inv, AXIS)).to(DTYPE).to(tl.float32)).to(DTYPE).to(tl.float32)
    gf = g.to(tl.float32)
    return (y * (gf / (1.0 + tl.exp(-gf)))).to(DTYPE)
