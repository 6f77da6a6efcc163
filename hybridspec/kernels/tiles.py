"""Jit helpers shared by the kernels of several ops."""

import triton
import triton.language as tl


@triton.jit
def dot_bt(b_a, b_b, acc, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """acc + A B^T: `tl.dot` of the tiles as they are (bf16 / fp16 on tensor cores: exact products,
    fp32 sums; fp32 at PRECISION), or (WIDEN, under the interpreter, whose tl.dot multiplies 16-bit
    floats as raw integers) the same product of the values widened to fp32."""
    if WIDEN:
        return tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(b_a, tl.trans(b_b), acc, input_precision=PRECISION)
