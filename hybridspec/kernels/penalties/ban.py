"""The second launch of `triton.penalized_logits`: min_tokens' ban and min_p on the penalised logits.

Grid (w, ceil(V / BV)): row i's two maxima per block (`triton.py`) decide whether min_tokens bans the
end tokens (some other token is above −∞) and the row's maximum after that ban; program (i, b) then
applies the ban and min_p to its block, in place. A row that neither bans nor has min_p writes
nothing. A NaN logit is not ordered (compiled `tl.max` passes over it); the reference's `amax`
would make the row's min_p threshold NaN.

    end [V] bool   scalars [6] fp32   out [w, V] fp32 (in place)   part [w · blocks · 2] fp32
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from hybridspec.kernels import pdl
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _ban_and_min_p_kernel(end_ptr, scalars_ptr, out_ptr, part_ptr, V, NB, BV: tl.constexpr, NBP: tl.constexpr,
                          USE_GDC: tl.constexpr):
    if USE_GDC:
        wait_then_release()
    i_r, i_b = tl.program_id(0), tl.program_id(1)
    o_b = tl.arange(0, NBP)
    p_row = part_ptr + (i_r * NB + o_b) * 2
    left_max = tl.max(tl.load(p_row, mask=o_b < NB, other=float("-inf")), 0)
    all_max = tl.max(tl.load(p_row + 1, mask=o_b < NB, other=float("-inf")), 0)
    early = tl.load(scalars_ptr + 3) + i_r.to(tl.float32) < tl.load(scalars_ptr + 4)
    ban = tl.where(early, left_max > float("-inf"), False)  # never the last tokens still allowed
    margin = tl.load(scalars_ptr + 5)
    if tl.where(ban, True, margin > float("-inf")):
        row_max = tl.where(ban, left_max, all_max)  # the row's maximum after the ban
        o_v = i_b * BV + tl.arange(0, BV)
        ok = o_v < V
        row = i_r.to(tl.int64)  # 64-bit row offsets: w · V may pass 2^31
        x = tl.load(out_ptr + row * V + o_v, mask=ok, other=0.0)
        x = tl.where(ban, tl.where(tl.load(end_ptr + o_v, mask=ok, other=0) != 0, float("-inf"), x), x)
        x = tl.where(x < row_max + margin, float("-inf"), x)
        tl.store(out_ptr + row * V + o_v, x, mask=ok)


def launch_ban_and_min_p(end: Tensor, scalars: Tensor, out: Tensor, part: Tensor, block_v: int) -> None:
    """Apply the ban and min_p to out [w, V] (contiguous fp32) from part's maxima (shapes above;
    `triton.penalized_logits` checks them)."""
    w, V = out.shape
    nb = triton.cdiv(V, block_v)
    _ban_and_min_p_kernel[(w, nb)](end, scalars, out, part, V, nb, BV=block_v, NBP=max(2, triton.next_power_of_2(nb)),
                                   num_warps=8, **pdl.options(out))
