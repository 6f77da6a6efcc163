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


@triton.jit
def prefetch_rows(p_rows, stride_row, i_part, n_parts, ROWS: tl.constexpr, WIDTH: tl.constexpr, LINE: tl.constexpr,
                  LINES_P2: tl.constexpr, BR: tl.constexpr):
    """Part i_part of n_parts of ROWS rows of WIDTH elements (row r at p_rows + r · stride_row) into
    the L2 cache, one `prefetch.global.L2::evict_last` per 128-byte line of LINE elements, BR rows at
    a time (LINES_P2: the lines per row rounded up to a power of two); a hint only: nothing is loaded
    into the program and no result depends on it."""
    LINES: tl.constexpr = (WIDTH + LINE - 1) // LINE
    o_r = tl.arange(0, BR)
    o_l = tl.minimum(tl.arange(0, LINES_P2), LINES - 1) * LINE  # padding repeats the last line
    per = tl.cdiv(ROWS, n_parts)
    for r in range(i_part * per, tl.minimum(i_part * per + per, ROWS), BR):
        b_r = tl.minimum(r + o_r, ROWS - 1)  # [BR] rows past the end repeat the last row
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                                  [p_rows + b_r[:, None] * stride_row + o_l[None, :]], dtype=tl.int32,
                                  is_pure=False, pack=1)
