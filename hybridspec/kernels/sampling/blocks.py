"""`@triton.jit` helpers of the (row, block) kernels over a vocabulary (`triton.py`, `statistics.py`):
each program stores its block's three partial values and an index, and the program that arrives
last reads every row's blocks back to combine them.

    part [rows · NB · 3] fp32   index [rows · NB] int32   arrivals [1] int32 (zero before the launch)
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels.tiles import last_to_arrive


@triton.jit
def arrive_with_block(part_ptr, index_ptr, arrivals_ptr, i_row, i_b, NB, first, second, third, index, PROGRAMS):
    """Store block (i_row, i_b)'s partials and index, then arrive: True for the program that arrives
    last of PROGRAMS, which then sees every block's stores."""
    p_part = part_ptr + (i_row * NB + i_b) * 3
    tl.store(p_part, first)
    tl.store(p_part + 1, second)
    tl.store(p_part + 2, third)
    tl.store(index_ptr + i_row * NB + i_b, index)
    return last_to_arrive(arrivals_ptr, PROGRAMS)


@triton.jit
def load_blocks(part_ptr, index_ptr, ROWS, NB, V, RP: tl.constexpr, NBP: tl.constexpr, THIRD_IS_MAX: tl.constexpr):
    """Every row's blocks as [RP, NBP] tiles, read past the L1 (other programs wrote them): (which
    entries exist, the first partials (−inf where none), the second (0), the third (−inf where none if
    THIRD_IS_MAX, else 0), the indices (V))."""
    o_r = tl.arange(0, RP)
    o_c = tl.arange(0, NBP)
    ok = (o_r < ROWS)[:, None] & (o_c < NB)[None, :]
    p_rc = part_ptr + (o_r[:, None] * NB + o_c[None, :]) * 3
    first = tl.load(p_rc, mask=ok, other=float("-inf"), cache_modifier=".cg")
    second = tl.load(p_rc + 1, mask=ok, other=0.0, cache_modifier=".cg")
    if THIRD_IS_MAX:
        third = tl.load(p_rc + 2, mask=ok, other=float("-inf"), cache_modifier=".cg")
    else:
        third = tl.load(p_rc + 2, mask=ok, other=0.0, cache_modifier=".cg")
    index = tl.load(index_ptr + o_r[:, None] * NB + o_c[None, :], mask=ok, other=V, cache_modifier=".cg")
    return ok, first, second, third, index
