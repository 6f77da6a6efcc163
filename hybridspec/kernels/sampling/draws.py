"""`@triton.jit` forms of `reference.keyed_uniforms`: the same 32-bit hash in int64, so the
kernels draw exactly the reference's uniforms."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _mul32(x, LO: tl.constexpr, HI: tl.constexpr):
    """x · (HI·2^16 + LO) mod 2^32 for x in [0, 2^32) held in int64."""
    return (x * LO + (((x * HI) & 0xFFFF) << 16)) & 0xFFFFFFFF


@triton.jit
def _mix32(x):
    """`reference._mix32`: the lowbias32 hash of x in [0, 2^32) held in int64."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x352D, 0x7FEB)
    x = x ^ (x >> 15)
    x = _mul32(x, 0xA68B, 0x846C)
    return x ^ (x >> 16)


@triton.jit
def position_key(seed, position):
    """The hash of (seed, position) that `reference.keyed_uniforms` mixes each lane into."""
    key = _mix32((seed & 0xFFFFFFFF) ^ 0x9E3779B9)
    key = _mix32(key ^ ((seed >> 32) & 0xFFFFFFFF))
    return _mix32(key ^ (position & 0xFFFFFFFF))


@triton.jit
def uniform(key, lane):
    """`reference.keyed_uniforms` for a position's key and lanes (int64) → fp32 in (0, 1)."""
    h = _mix32(key ^ (lane & 0xFFFFFFFF))
    return ((h >> 8).to(tl.float32) + 0.5) * 5.9604644775390625e-08  # 2^-24
