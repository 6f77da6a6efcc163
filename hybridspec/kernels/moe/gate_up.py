"""First half of the experts: act = w · silu(x W_gate^T) * (x W_up^T) for each distinct expert.

Grid (N·k, ceil(max(I, Is) / BN)), fixed by N and k. Program (s, t) takes assignment s's expert
from the ids and runs it only where s is that expert's first assignment (`tiles.assignment_expert`),
on the tokens that route to it (at most one row per token, N <= BM, so every expert's tokens fit
one [BM, BK] tile and its weights are read once), columns t·BN..t·BN+BN−1 of its intermediate width.
The shared expert has no programs of its own: its Is columns are cut into k·tiles pieces of SB
columns, and program (s, t) of token 0's rows (s < k) also runs piece s·tiles + t on every token,
in the same steps over the hidden dimension as its routed expert (one [SBP, BK] tile more per step:
the piece's gate and up rows interleaved, then the gate weight row, whose product is the shared
expert's scale logit). Token 0's rows run their piece even where they run no expert (ids of experts
held elsewhere); the other rows' programs that run no expert return at once. So the shared expert's
2·Is·H weights add about SB/BN of a routed tile to k·tiles programs instead of a row of programs of
its own, which at one or two tokens would run after the routed ones as a wave of their own. With
`MoETuning.shared_row` the shared expert instead runs in a program row of its own (s = N·k; grid
N·k + 1 rows), its scale logit summed in fp32 outside the tensor cores. Program (0, 0) also zeroes
the down kernel's arrival counters, before the down launch passes its wait. Each result row is
scaled by its routing weight (the shared expert's by sigmoid(x · gate_weight)) and stored at
act[n, j] (j: the token's position among its k experts; the shared expert's at j = k), in the
weights' dtype, for the down kernel to sum.

    x [N, H]   gate_up [E, 2I, H]   shared gate / up [Is, H], gate_weight [1, H]
    act [N, k + 1, max(I, Is)]   arrivals [tiles] int32 (zeroed)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hybridspec.kernels import pdl
from hybridspec.kernels.moe.tiles import assignment_expert
from hybridspec.kernels.moe.tuning import step_width
from hybridspec.kernels.pdl import wait_then_release
from hybridspec.kernels.tiles import dot_bt


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
def _shared_products(p_x, sg_ptr, su_ptr, sgw_ptr, o_n, o_c, m_ok, stride_sgn, stride_sun, H: tl.constexpr,
                     IS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """`MoETuning.shared_row`: the shared expert's [BM, BN] gate and up products for every token and
    its [BM] output scale, in a program row of its own."""
    p_g = sg_ptr + o_n[:, None] * stride_sgn + o_c[None, :]
    p_u = su_ptr + o_n[:, None] * stride_sun + o_c[None, :]
    acc_g, acc_u = gated_products(p_x, p_g, p_u, m_ok, o_n < IS, H, BM, BN, BK, PRECISION, WIDEN)
    return acc_g, acc_u, shared_gate(p_x, sgw_ptr, m_ok, H, BM, BK)


@triton.jit
def _piece_rows(sg_ptr, su_ptr, sgw_ptr, piece, stride_sgn, stride_sun, IS, SB: tl.constexpr,
                SBP: tl.constexpr, BK: tl.constexpr):
    """Pointers [SBP, BK] (at hidden column 0) and row mask [SBP] of a shared-expert piece's tile:
    rows 2c and 2c + 1 are the gate and up rows of the piece's column c < SB, row 2·SB the gate
    weight; the rest, and columns past Is, masked."""
    o_r = tl.arange(0, SBP)
    col = piece * SB + o_r // 2
    is_col = (o_r < 2 * SB) & (col < IS)
    p_gate = sg_ptr + col * stride_sgn
    p_up = su_ptr + col * stride_sun
    p_row = tl.where(o_r == 2 * SB, sgw_ptr, tl.where(o_r % 2 == 0, p_gate, p_up))
    row_ok = is_col | (o_r == 2 * SB)
    return p_row[:, None] + tl.arange(0, BK)[None, :], row_ok


@triton.jit
def _products_with_piece(p_x, p_g, p_u, p_s, m_ok, n_ok, s_ok, ROUTED: tl.constexpr, H: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SBP: tl.constexpr,
                         PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """The routed [BM, BN] gate and up products (zeros unless ROUTED) and the shared piece's
    [BM, SBP] products, for every token (each row depends on its own token alone; the caller stores
    the routed rows of the tokens that route to the expert), in one pass over the hidden dimension
    in steps of BK."""
    o_c = tl.arange(0, BK)
    acc_g = tl.zeros([BM, BN], dtype=tl.float32)
    acc_u = tl.zeros([BM, BN], dtype=tl.float32)
    acc_s = tl.zeros([BM, SBP], dtype=tl.float32)
    for c in range(0, H, BK):
        c_ok = c + o_c < H
        b_x = tl.load(p_x + c, mask=m_ok[:, None] & c_ok[None, :], other=0.0)  # [BM, BK]
        if ROUTED:
            b_g = tl.load(p_g + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
            b_u = tl.load(p_u + c, mask=n_ok[:, None] & c_ok[None, :], other=0.0)  # [BN, BK]
            acc_g = dot_bt(b_x, b_g, acc_g, PRECISION, WIDEN)
            acc_u = dot_bt(b_x, b_u, acc_u, PRECISION, WIDEN)
        b_s = tl.load(p_s + c, mask=s_ok[:, None] & c_ok[None, :], other=0.0)  # [SBP, BK]
        acc_s = dot_bt(b_x, b_s, acc_s, PRECISION, WIDEN)
    return acc_g, acc_u, acc_s


@triton.jit
def _store_act(act_ptr, acc_g, acc_u, scale, o_m, b_kpos, m_ok, o_n, n_ok, stride_an, stride_ak):
    b_act = acc_g * tl.sigmoid(acc_g) * acc_u * scale[:, None]  # [BM, BN] silu(gate) * up, weighted
    p_a = act_ptr + o_m[:, None] * stride_an + b_kpos[:, None] * stride_ak + o_n[None, :]
    tl.store(p_a, b_act.to(act_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _store_piece(act_ptr, acc_s, piece, o_m, m_ok, IS, stride_an, stride_ak, K: tl.constexpr, SB: tl.constexpr,
                 SBP: tl.constexpr, BM: tl.constexpr):
    """The shared piece's columns from its interleaved products acc_s [BM, SBP]: silu(gate) * up
    scaled by sigmoid(x · gate_weight) (column 2·SB), stored at act[n, k, piece·SB + c]."""
    s_g, s_u = tl.split(tl.reshape(acc_s, [BM, SBP // 2, 2]))  # [BM, SBP / 2] each: gate, up of column c
    o_h = tl.arange(0, SBP // 2)
    logit = tl.sum(tl.where(o_h[None, :] == SB, s_g, 0.0), 1)  # [BM]: x · gate_weight (its row 2·SB)
    col = piece * SB + o_h
    _store_act(act_ptr, s_g, s_u, tl.sigmoid(logit), o_m, tl.full([BM], K, dtype=tl.int32), m_ok, col,
               (o_h < SB) & (col < IS), stride_an, stride_ak)


@triton.jit
def _moe_gate_up_kernel(x_ptr, rw_ptr, gu_ptr, sg_ptr, su_ptr, sgw_ptr, ids_ptr, arrivals_ptr, act_ptr, FIRST,
                        stride_xn, stride_ge, stride_gn, stride_sgn, stride_sun, stride_an, stride_ak, N, TILES,
                        E: tl.constexpr, K: tl.constexpr, H: tl.constexpr, I: tl.constexpr, IS: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SB: tl.constexpr, SBP: tl.constexpr,
                        SHARED_ROW: tl.constexpr, NKP: tl.constexpr, KP: tl.constexpr, TP: tl.constexpr,
                        PRECISION: tl.constexpr, WIDEN: tl.constexpr, USE_GDC: tl.constexpr):
    i_s, i_t = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BM)
    o_n = i_t * BN + tl.arange(0, BN)
    o_c = tl.arange(0, BK)
    m_ok = o_m < N
    n_ok = o_n < I
    p_x = x_ptr + o_m[:, None] * stride_xn + o_c[None, :]
    if USE_GDC:
        wait_then_release()  # nothing is read or stored before this point
    if (i_s == 0) & (i_t == 0):  # the down kernel's arrival counters, zeroed before it starts
        o_r = tl.arange(0, TP)
        tl.store(arrivals_ptr + o_r, tl.zeros([TP], tl.int32), mask=o_r < TILES)
    if SHARED_ROW:
        if i_s < N * K:
            e, b_kpos, active = assignment_expert(ids_ptr, i_s, N, FIRST, E, K, BM, NKP, KP)
            if active:
                hit = b_kpos >= 0
                p_g = gu_ptr + e * stride_ge + o_n[:, None] * stride_gn + o_c[None, :]
                acc_g, acc_u = gated_products(p_x, p_g, p_g + I * stride_gn, hit, n_ok, H, BM, BN, BK, PRECISION,
                                              WIDEN)
                b_w = tl.load(rw_ptr + o_m * K + b_kpos, mask=hit, other=0.0).to(tl.float32)  # [BM]
                _store_act(act_ptr, acc_g, acc_u, b_w, o_m, b_kpos, hit, o_n, n_ok, stride_an, stride_ak)
        else:
            s_g, s_u, s_scale = _shared_products(p_x, sg_ptr, su_ptr, sgw_ptr, o_n, o_c, m_ok, stride_sgn,
                                                 stride_sun, H, IS, BM, BN, BK, PRECISION, WIDEN)
            _store_act(act_ptr, s_g, s_u, s_scale, o_m, tl.full([BM], K, dtype=tl.int32), m_ok, o_n, o_n < IS,
                       stride_an, stride_ak)
    else:
        e, b_kpos, active = assignment_expert(ids_ptr, i_s, N, FIRST, E, K, BM, NKP, KP)
        hit = b_kpos >= 0
        p_g = gu_ptr + e * stride_ge + o_n[:, None] * stride_gn + o_c[None, :]
        piece = i_s * tl.num_programs(1) + i_t
        if (i_s < K) & (piece * SB < IS):  # a piece of the shared expert (none when IS = 0), with or without an expert
            p_s, s_ok = _piece_rows(sg_ptr, su_ptr, sgw_ptr, piece, stride_sgn, stride_sun, IS, SB, SBP, BK)
            if active:
                acc_g, acc_u, acc_s = _products_with_piece(p_x, p_g, p_g + I * stride_gn, p_s, m_ok, n_ok, s_ok, True,
                                                           H, BM, BN, BK, SBP, PRECISION, WIDEN)
                b_w = tl.load(rw_ptr + o_m * K + b_kpos, mask=hit, other=0.0).to(tl.float32)  # [BM]
                _store_act(act_ptr, acc_g, acc_u, b_w, o_m, b_kpos, hit, o_n, n_ok, stride_an, stride_ak)
            else:
                _, _, acc_s = _products_with_piece(p_x, p_g, p_g, p_s, m_ok, n_ok, s_ok, False, H, BM, BN, BK, SBP,
                                                   PRECISION, WIDEN)
            _store_piece(act_ptr, acc_s, piece, o_m, m_ok, IS, stride_an, stride_ak, K, SB, SBP, BM)
        elif active:
            acc_g, acc_u = gated_products(p_x, p_g, p_g + I * stride_gn, hit, n_ok, H, BM, BN, BK, PRECISION, WIDEN)
            b_w = tl.load(rw_ptr + o_m * K + b_kpos, mask=hit, other=0.0).to(tl.float32)  # [BM]
            _store_act(act_ptr, acc_g, acc_u, b_w, o_m, b_kpos, hit, o_n, n_ok, stride_an, stride_ak)


def shared_pieces(k: int, tiles: int, shared_width: int) -> tuple[int, int]:
    """(SB, SBP): columns of the shared expert per piece, so that token 0's k·tiles programs cover its
    `shared_width` columns, and the rows of a piece's tile (2·SB interleaved gate and up rows and the
    gate weight's, a power of two >= 16, tl.dot's smallest tile)."""
    sb = max(1, triton.cdiv(shared_width, k * tiles))
    return sb, max(16, triton.next_power_of_2(2 * sb + 1))


def launch_gate_up(x, ids, weights, gate_up, shared, arrivals, act, block_m: int, tuning, widen: bool,
                   first_expert: int = 0) -> None:
    """x [N, H], ids / weights [N, k] (ids contiguous; experts first_expert… first_expert + E − 1 of
    them held in gate_up [E, 2I, H]), shared (SharedExpert or None), arrivals (int32, one per column
    tile of the down kernel; this launch zeroes them), act [N, k + 1, max(I, Is)] (written); widen:
    under the interpreter."""
    n, k = weights.shape
    if tuple(ids.shape) != (n, k) or not ids.is_contiguous():
        raise ValueError(f"launch_gate_up: ids must be contiguous [N, k] = {(n, k)}, got {tuple(ids.shape)} "
                         f"with strides {ids.stride()}")
    i = gate_up.shape[1] // 2
    i_s = shared.gate.shape[0] if shared is not None else 0
    sg, su, sgw = (shared.gate, shared.up, shared.gate_weight) if shared is not None else (gate_up,) * 3
    bn = min(tuning.gate_up_bn, max(16, triton.next_power_of_2(max(i, i_s))))
    tiles = triton.cdiv(max(i, i_s), bn)
    sb, sbp = shared_pieces(k, tiles, i_s)
    pieces = shared is not None and not tuning.shared_row
    rows = block_m + 2 * bn + (sbp if pieces else 0)  # the tiles of one step
    bk = step_width(tuning.gate_up_bk, x.shape[1], rows, x.element_size(), tuning.gate_up_stages)
    _moe_gate_up_kernel[(n * k + (shared is not None and tuning.shared_row), tiles)](
        x, weights, gate_up, sg, su, sgw, ids, arrivals, act, first_expert,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), sg.stride(0), su.stride(0), act.stride(0), act.stride(1),
        N=n, TILES=arrivals.numel(), E=gate_up.shape[0], K=k, H=x.shape[1], I=i, IS=i_s, BM=block_m, BN=bn, BK=bk,
        SB=sb, SBP=sbp, SHARED_ROW=tuning.shared_row, NKP=triton.next_power_of_2(block_m * k),
        KP=triton.next_power_of_2(k), TP=max(2, triton.next_power_of_2(arrivals.numel())),
        PRECISION="ieee" if x.dtype == torch.float32 else "tf32", WIDEN=widen,
        num_warps=tuning.gate_up_warps, num_stages=tuning.gate_up_stages, **pdl.options(x))
