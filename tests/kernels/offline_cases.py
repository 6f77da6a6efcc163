"""Two kernels for `test_offline.py`: one that compiles, and one that the interpreter runs but the
compiler refuses (a variable given another shape inside a branch)."""

import triton
import triton.language as tl


@triton.jit
def good_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    o = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + o, mask=o < n, other=0.0)
    tl.store(out_ptr, tl.sum(x, 0))


@triton.jit
def reshaped_in_a_branch_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    left = o < n
    if tl.program_id(0) == 0:
        o_half = tl.arange(0, BLOCK // 2)
        left = o_half < n
        tl.store(out_ptr + o_half, tl.where(left, 1.0, 0.0))
    tl.store(out_ptr + BLOCK + o, tl.where(left, 1.0, 0.0))
