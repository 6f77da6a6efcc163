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


@triton.jit
def last_to_arrive(counter_ptr, programs):
    """Count this program in at `counter_ptr` (int32); True in the one that arrives last of
    `programs`, which then sees every other program's stores made before they arrived (the
    barrier orders each program's threads, the acquire-release add orders the programs)."""
    tl.debug_barrier()  # every thread's stores made before the release below
    return tl.atomic_add(counter_ptr, 1, sem="acq_rel") == programs - 1


@triton.jit
def vocab_block(p_rows, stride, V, BV: tl.constexpr, OTHER: tl.constexpr):
    """The (row, block) program's slice of a [rows, V] tensor at `p_rows` (row stride `stride`, unit
    column stride), for the kernels whose grid is (rows, ceil(V / BV)): (i_r, i_b, o_v [BV] column
    ids, ok [BV] columns inside V, x [BV] fp32 with OTHER outside V). Row offsets are 64-bit: rows · V
    may pass 2^31."""
    i_r, i_b = tl.program_id(0), tl.program_id(1)
    o_v = i_b * BV + tl.arange(0, BV)
    ok = o_v < V
    x = tl.load(p_rows + i_r.to(tl.int64) * stride + o_v, mask=ok, other=OTHER).to(tl.float32)
    return i_r, i_b, o_v, ok, x
