"""`@triton.jit` helpers shared by the MoE kernels."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dot_bt(b_a, b_b, acc, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """acc + A B^T: a tensor-core product of the tiles as they are (bf16 / fp16: exact products,
    fp32 sums), or (WIDEN, under the interpreter, whose tl.dot multiplies 16-bit floats as raw
    integers) the same product of the values widened to fp32."""
    if WIDEN:
        return tl.dot(b_a.to(tl.float32), tl.trans(b_b.to(tl.float32)), acc, input_precision="ieee")
    return tl.dot(b_a, tl.trans(b_b), acc, input_precision=PRECISION)


@triton.jit
def gated_products(p_x, p_g, p_u, x_ok, n_ok, H: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                    BK: tl.constexpr, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """[BM, BN] fp32 products x W_gate^T and x W_up^T over the hidden dimension in steps of BK."""
    o_c = tl.arange(0, BK)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    for c in range(0, H, BK):
        c_ok = c + o_c < H
        b_x = tl.load(p_x + c, mask=x_ok[:, None] & c_ok[None, :], other=0.0)  # [BM, BK]
        b_g = tl.load(p_g + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
        b_u = tl.load(p_u + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
        acc_g = dot_bt(b_x, b_g, acc_g, PRECISION, WIDEN)
        acc_u = dot_bt(b_x, b_u, acc_u, PRECISION, WIDEN)
    return acc_g, acc_u


@triton.jit
def shared_gate(p_x, sgw_ptr, x_ok, H: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr):
    """[BM] sigmoid(x · gate_weight): the shared expert's output scale for each row of x."""
    o_c = tl.arange(0, BK)
    acc = tl.zeros([BM], dtype=tl.float32)
    for c in range(0, H, BK):
        c_ok = c + o_c < H
        b_x = tl.load(p_x + c, mask=x_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(b_x * tl.load(sgw_ptr + c + o_c, mask=c_ok, other=0.0).to(tl.float32)[None, :], 1)
    return tl.sigmoid(acc)
