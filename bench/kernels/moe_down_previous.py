"""The register-slice down launch as it was before its ids moved before the PDL wait (one expert id
loaded after the wait per assignment, one [BH, I] product at a time), kept for `moe_kernels.py`'s
DOWN_SWEEP side by side with the shipped `hybridspec/kernels/moe/down_rows.py`.

Second half of the experts for calls of a few tokens, each program holding [BH, I] slices of
down weights in registers (the form of `kernels/linear/rows.py`).

Grid ceil(H / BH): program t computes out[n, t·BH..t·BH+BH−1] for every token n of the call, as
sum_j act[n, j] · W_down_{e_j}[rows]^T over the token's k experts (e_j = ids[n, j]) and then the
shared expert (act row k), in the order j = 0..k, fp32, one rounding to out's dtype. act already
carries each routing weight (`gate_up_rows.py`). A token's experts are distinct, so each expert's
slice is read once per token from memory; tokens that share an expert read it again, from the
cache. Under expert parallelism (experts [first, first + E) held here) the experts held elsewhere
add nothing.

    act [N, k + 1, max(I, Is)]   down [E, H, I]   shared down [H, Is]   out [N, H]
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.checks import down_operands
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _row_product(p_d, stride_d, p_a, o_h, h_ok, width, DP: tl.constexpr):
    """[BH] fp32: rows o_h (where h_ok) of a weight at p_d times the act row at p_a, over the first
    `width` columns (0: an expert held elsewhere, whose act row no launch wrote: zeros)."""
    o_c = tl.arange(0, DP)
    c_ok = o_c < width  # [DP] (vector compares: the interpreter's masks need them)
    b_d = tl.load(p_d + o_h[:, None] * stride_d + o_c[None, :], mask=h_ok[:, None] & c_ok[None, :], other=0.0)
    b_a = tl.load(p_a + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [DP]
    return tl.sum(b_d.to(tl.float32) * b_a[None, :], 1)


@triton.jit
def _moe_down_rows_kernel(act_ptr, d_ptr, sd_ptr, ids_ptr, out_ptr, FIRST, stride_an, stride_ak, stride_de,
                          stride_dh, stride_sdh, stride_on, N: tl.constexpr, K: tl.constexpr, E: tl.constexpr,
                          H: tl.constexpr, I: tl.constexpr, IP: tl.constexpr, IS: tl.constexpr, ISP: tl.constexpr,
                          BH: tl.constexpr, USE_GDC: tl.constexpr):
    o_h = tl.program_id(0) * BH + tl.arange(0, BH)
    h_ok = o_h < H
    if USE_GDC:
        wait_then_release()
    for m in tl.static_range(N):
        total = tl.zeros([BH], dtype=tl.float32)
        for j in tl.static_range(K):
            e = tl.load(ids_ptr + m * K + j).to(tl.int64) - FIRST
            width = tl.where((e >= 0) & (e < E), I, 0)
            total += _row_product(d_ptr + e * stride_de, stride_dh, act_ptr + m * stride_an + j * stride_ak, o_h,
                                  h_ok, width, IP)
        if IS > 0:
            total += _row_product(sd_ptr, stride_sdh, act_ptr + m * stride_an + K * stride_ak, o_h, h_ok, IS, ISP)
        tl.store(out_ptr + m * stride_on + o_h, total.to(out_ptr.dtype.element_ty), mask=h_ok)


def launch_down_rows(act, down, shared, ids, out, block_h: int, warps: int, first_expert: int = 0) -> None:
    """act [N, k + 1, max(I, Is)] from a gate_up launch, down [E, H, I] (experts first_expert…
    first_expert + E − 1 of the ids), shared (or None), ids [N, k] (contiguous), out [N, H] (written,
    rows contiguous); block_h output columns per program."""
    n, k, e, h, i, i_s, sd = down_operands("launch_down_rows", act, down, shared, ids)
    _moe_down_rows_kernel[(triton.cdiv(h, block_h),)](
        act, down, sd, ids, out, first_expert, act.stride(0), act.stride(1), down.stride(0), down.stride(1),
        sd.stride(0), out.stride(0), N=n, K=k, E=e, H=h, I=i, IP=triton.next_power_of_2(i), IS=i_s,
        ISP=triton.next_power_of_2(max(i_s, 1)), BH=block_h, num_warps=warps, **pdl.options(act))
