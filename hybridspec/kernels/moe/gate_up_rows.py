"""First half of the experts for calls of a few tokens, each program holding its slice of an
expert's gate and up rows in registers (the form of `kernels/linear/rows.py`: one load of the whole
slice, every program's bytes in flight at once, no shared-memory pipeline, no tensor cores).

Grid (N·k, plus 1 with a shared expert; ceil(max(I, Is) / BN)), fixed by N and k. Program (s, t) with s < N·k takes
assignment s's expert from the ids and runs it only where s is that expert's first assignment
(`tiles.assignment_expert`), so each distinct expert's rows are read once for all its tokens:
intermediate columns t·BN..t·BN+BN−1, gate and up rows [BN, H] each. Program s = N·k runs the shared
expert's rows on every token, scaled by sigmoid(x · gate_weight). Each token's result row is
act = w · silu(x W_gate^T) * (x W_up^T) (fp32 sums, one rounding to the weights' dtype), stored at
act[n, j] (j: the token's position among its k experts; the shared expert's at j = k), as
`gate_up.py` stores it for `down_rows.py` or `down.py` to sum.

    x [N, H]   gate_up [E, 2I, H]   shared gate / up [Is, H], gate_weight [1, H]   act [N, k + 1, max(I, Is)]
"""

from __future__ import annotations

import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.checks import gate_up_operands
from hybridspec.kernels.moe.tiles import assignment_expert
from hybridspec.kernels.pdl import wait_then_release


@triton.jit
def _gated_row(x_ptr, b_g, b_u, scale, act_ptr, o_c, c_ok, o_n, n_ok):
    """One token's act row over the slice's columns: scale · silu(x · g) * (x · u), stored."""
    b_x = tl.load(x_ptr + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [HP]
    acc_g = tl.sum(b_g.to(tl.float32) * b_x[None, :], 1)  # [BN]
    acc_u = tl.sum(b_u.to(tl.float32) * b_x[None, :], 1)
    b_act = acc_g * tl.sigmoid(acc_g) * acc_u * scale
    tl.store(act_ptr + o_n, b_act.to(act_ptr.dtype.element_ty), mask=n_ok)


@triton.jit
def _moe_gate_up_rows_kernel(x_ptr, rw_ptr, gu_ptr, sg_ptr, su_ptr, sgw_ptr, ids_ptr, act_ptr, FIRST,
                             stride_xn, stride_ge, stride_gn, stride_sgn, stride_sun, stride_an, stride_ak,
                             N: tl.constexpr, E: tl.constexpr, K: tl.constexpr, H: tl.constexpr, HP: tl.constexpr,
                             I: tl.constexpr, IS: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                             NKP: tl.constexpr, KP: tl.constexpr, USE_GDC: tl.constexpr):
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_n = i_t * BN + tl.arange(0, BN)
    o_c = tl.arange(0, HP)
    o_m = tl.arange(0, BM)
    c_ok = o_c < H
    if USE_GDC:
        wait_then_release()  # nothing is read or stored before this point
    if i_s < N * K:
        e, b_kpos, active = assignment_expert(ids_ptr, i_s, N, FIRST, E, K, BM, NKP, KP)
        if active:
            n_ok = o_n < I
            w_ok = n_ok[:, None] & c_ok[None, :]
            p_g = gu_ptr + e * stride_ge + o_n[:, None] * stride_gn + o_c[None, :]
            b_g = tl.load(p_g, mask=w_ok, other=0.0)  # [BN, HP] gate rows
            b_u = tl.load(p_g + I * stride_gn, mask=w_ok, other=0.0)  # [BN, HP] up rows
            for m in tl.static_range(N):
                kpos = tl.sum(tl.where(o_m == m, b_kpos, 0), 0)  # token m's position j of e, or -1
                if kpos >= 0:
                    scale = tl.load(rw_ptr + m * K + kpos).to(tl.float32)
                    _gated_row(x_ptr + m * stride_xn, b_g, b_u, scale, act_ptr + m * stride_an + kpos * stride_ak,
                               o_c, c_ok, o_n, n_ok)
    else:
        n_ok = o_n < IS
        w_ok = n_ok[:, None] & c_ok[None, :]
        b_g = tl.load(sg_ptr + o_n[:, None] * stride_sgn + o_c[None, :], mask=w_ok, other=0.0)  # [BN, HP]
        b_u = tl.load(su_ptr + o_n[:, None] * stride_sun + o_c[None, :], mask=w_ok, other=0.0)
        b_sgw = tl.load(sgw_ptr + o_c, mask=c_ok, other=0.0).to(tl.float32)  # [HP]
        for m in tl.static_range(N):
            b_x = tl.load(x_ptr + m * stride_xn + o_c, mask=c_ok, other=0.0).to(tl.float32)
            scale = tl.sigmoid(tl.sum(b_x * b_sgw, 0))
            _gated_row(x_ptr + m * stride_xn, b_g, b_u, scale, act_ptr + m * stride_an + K * stride_ak,
                       o_c, c_ok, o_n, n_ok)


def launch_gate_up_rows(x, ids, weights, gate_up, shared, act, block_n: int, warps: int,
                        first_expert: int = 0) -> None:
    """x [N, H] (rows contiguous), ids / weights [N, k] (ids contiguous; experts first_expert…
    first_expert + E − 1 of them held in gate_up [E, 2I, H]), shared (SharedExpert or None),
    act [N, k + 1, max(I, Is)] (written); block_n intermediate columns per program."""
    n, k, i, i_s, (sg, su, sgw) = gate_up_operands("launch_gate_up_rows", ids, weights, gate_up, shared)
    h = x.shape[1]
    block_m = max(2, triton.next_power_of_2(n))
    grid = (n * k + (shared is not None), triton.cdiv(max(i, i_s), block_n))
    if grid[1] > 65535:
        raise ValueError(f"launch_gate_up_rows: {grid[1]} column slices of {block_n} exceed the grid's 65,535; "
                         "take wider slices (MoETuning.rows_bn)")
    _moe_gate_up_rows_kernel[grid](
        x, weights, gate_up, sg, su, sgw, ids, act, first_expert,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), sg.stride(0), su.stride(0), act.stride(0), act.stride(1),
        N=n, E=gate_up.shape[0], K=k, H=h, HP=triton.next_power_of_2(h), I=i, IS=i_s, BN=block_n, BM=block_m,
        NKP=triton.next_power_of_2(block_m * k), KP=triton.next_power_of_2(k), num_warps=warps, **pdl.options(x))
