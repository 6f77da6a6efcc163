"""Triton MoE experts: the same signature, layouts and result as `reference.moe_experts`.

Two launches per call of at most 64 tokens, none reading the host and each with a grid fixed by
(N, k): `gate_up` runs each distinct expert's gate and up projections once for all its tokens (each
program row takes its expert from the ids, `tiles.assignment_expert`) and zeroes the down kernel's
arrival counters, `down` sums every token's weighted expert outputs and the shared expert's. Longer
calls (prefill) run in 64-token pieces. Calls whose tuning row says `rows` (a few tokens) take the
register-slice forms of both launches instead (`gate_up_rows.py`, `down_rows.py`).
Accumulation is fp32; in the tile kernels bf16 weights use bf16 tensor-core products, fp32 weights
IEEE fp32 ones; the register-slice kernels multiply and add in fp32 without tensor cores.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from hybridspec.kernels.interpreter import check_device, interpreted
from hybridspec.kernels.moe.checks import SharedExpert, check_moe_args
from hybridspec.kernels.moe.down import column_tiles, launch_down
from hybridspec.kernels.moe.down_rows import launch_down_rows
from hybridspec.kernels.moe.gate_up import launch_gate_up
from hybridspec.kernels.moe.gate_up_rows import launch_gate_up_rows
from hybridspec.kernels.moe.tuning import MOE_TUNING, tuning_for

MAX_TOKENS = 64  # tokens per launch: one [BM <= 64, BK] activation tile per expert


def _check_layout(x: Tensor, gate_up: Tensor, down: Tensor, shared: SharedExpert | None) -> None:
    weights = {"gate_up": gate_up, "down": down,
               **({f"shared.{f}": t for f, t in shared._asdict().items()} if shared is not None else {})}
    for name, t in {"x": x, **weights}.items():
        if t.stride(-1) != 1:
            raise ValueError(f"moe_experts: {name} must be contiguous in its last dimension (stride {t.stride()})")
    for name, t in weights.items():
        if t.dtype != x.dtype:
            raise ValueError(f"moe_experts: {name} has dtype {t.dtype}, x has {x.dtype}")
    check_device("moe_experts", x=x)
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"moe_experts: dtype {x.dtype} (float32, bfloat16 or float16)")


def moe_experts(x: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                shared: SharedExpert | None = None, *, first_expert: int = 0, tuning=None) -> Tensor:
    """x [N, H], ids / weights [N, k], gate_up [E, 2I, H], down [E, H, I] → [N, H] (layouts in
    `checks.py`): sum_j weights[n, j] · expert_{ids[n, j]}(x_n) + the gated shared expert, over the
    experts [first_expert, first_expert + E) of the ids (expert parallelism: the others are held
    elsewhere and add nothing here). tuning: a table like `tuning.MOE_TUNING` (this module's
    `MOE_TUNING` when None, looked up at each call)."""
    n = check_moe_args("moe_experts", x, ids, weights, gate_up, down, shared)[0]
    _check_layout(x, gate_up, down, shared)
    out = torch.empty_like(x)
    for start in range(0, n, MAX_TOKENS):
        piece = slice(start, min(start + MAX_TOKENS, n))
        _moe_piece(x[piece], ids[piece].contiguous(), weights[piece].contiguous(), gate_up, down, shared,
                   out[piece], tuning_for(piece.stop - piece.start, MOE_TUNING if tuning is None else tuning),
                   first_expert)
    return out


def _moe_piece(x, ids, weights, gate_up, down, shared, out, tuning, first_expert: int) -> None:
    # no launch between gate_up and down: the down launches may read the ids before their PDL wait
    # (written before gate_up, so two launches back; `kernels/pdl.py`)
    n, k = ids.shape
    i, i_s = gate_up.shape[1] // 2, shared.gate.shape[0] if shared is not None else 0
    act = torch.empty((n, k + 1, max(i, i_s)), dtype=x.dtype, device=x.device)  # [N, k + 1, max(I, Is)]
    if tuning.rows:
        launch_gate_up_rows(x, ids, weights, gate_up, shared, act, tuning.rows_bn, tuning.rows_warps, first_expert)
        launch_down_rows(act, down, shared, ids, out, tuning.rows_bh, tuning.rows_warps, first_expert)
        return
    block_m = max(16, triton.next_power_of_2(n))
    arrivals = torch.empty(column_tiles(x.shape[1], tuning)[1], dtype=torch.int32, device=x.device)  # gate_up zeroes
    launch_gate_up(x, ids, weights, gate_up, shared, arrivals, act, block_m, tuning, interpreted(), first_expert)
    launch_down(act, down, shared, ids, arrivals, out, block_m, tuning, interpreted(), first_expert)
