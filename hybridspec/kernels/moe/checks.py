"""Argument checks shared by the MoE reference and the Triton launchers.

Layouts (the runtime's fused 3-D expert weights, DESIGN B.4):
    x        [N, H]          activations (bf16 or fp32)
    ids      [N, k]          expert ids of each token (integer), k distinct ids per row
    weights  [N, k]          routing weights
    gate_up  [E, 2I, H]      rows 0..I-1 the gate projection, rows I..2I-1 the up projection
    down     [E, H, I]
    shared   SharedExpert: gate, up [Is, H], down [H, Is], gate_weight [1, H]
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class SharedExpert(NamedTuple):
    """The dense expert every token runs, its output scaled by sigmoid(x · gate_weight)."""

    gate: Tensor  # [Is, H]
    up: Tensor  # [Is, H]
    down: Tensor  # [H, Is]
    gate_weight: Tensor  # [1, H]


def _shape(fn: str, name: str, t: Tensor, layout: str, expected: tuple[int, ...]) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"{fn}: {name} has shape {tuple(t.shape)}, expected [{layout}] = {expected}")


def check_moe_args(fn: str, x: Tensor, ids: Tensor, weights: Tensor, gate_up: Tensor, down: Tensor,
                   shared: SharedExpert | None) -> tuple[int, int, int, int]:
    """Validate the layouts above; returns (N, k, E, I). Raises ValueError naming the argument."""
    if x.dim() != 2:
        raise ValueError(f"{fn}: x has {x.dim()} dims, expected [N, H]")
    n, h = x.shape
    if ids.dim() != 2 or ids.shape[0] != n:
        raise ValueError(f"{fn}: ids has shape {tuple(ids.shape)}, expected [N, k] with N = {n}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ValueError(f"{fn}: ids has dtype {ids.dtype}, expected an integer dtype")
    k = ids.shape[1]
    _shape(fn, "weights", weights, "N, k", (n, k))
    if gate_up.dim() != 3 or gate_up.shape[2] != h or gate_up.shape[1] % 2:
        raise ValueError(f"{fn}: gate_up has shape {tuple(gate_up.shape)}, expected [E, 2I, H] with H = {h}")
    e, i = gate_up.shape[0], gate_up.shape[1] // 2
    _shape(fn, "down", down, "E, H, I", (e, h, i))
    if shared is not None:
        i_s = shared.gate.shape[0]
        _shape(fn, "shared.gate", shared.gate, "Is, H", (i_s, h))
        _shape(fn, "shared.up", shared.up, "Is, H", (i_s, h))
        _shape(fn, "shared.down", shared.down, "H, Is", (h, i_s))
        _shape(fn, "shared.gate_weight", shared.gate_weight, "1, H", (1, h))
    tensors = {"x": x, "ids": ids, "weights": weights, "gate_up": gate_up, "down": down,
               **({f"shared.{f}": t for f, t in shared._asdict().items()} if shared is not None else {})}
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"{fn}: tensors on different devices: {devices}")
    return n, k, e, i


def gate_up_operands(fn: str, ids: Tensor, weights: Tensor, gate_up: Tensor, shared: SharedExpert | None):
    """A gate_up launcher's shared checks and operands: (N, k, I, Is, (shared gate, up, gate
    weight)), gate_up standing in for the shared tensors when there is no shared expert (Is = 0).
    ValueError unless ids and weights are contiguous [N, k]."""
    n, k = weights.shape
    if tuple(ids.shape) != (n, k) or not ids.is_contiguous() or not weights.is_contiguous():
        raise ValueError(f"{fn}: ids and weights must be contiguous [N, k] = {(n, k)}, got {tuple(ids.shape)} "
                         f"with strides {ids.stride()} / {tuple(weights.shape)} with strides {weights.stride()}")
    i_s = shared.gate.shape[0] if shared is not None else 0
    parts = (shared.gate, shared.up, shared.gate_weight) if shared is not None else (gate_up,) * 3
    return n, k, gate_up.shape[1] // 2, i_s, parts


def down_operands(fn: str, act: Tensor, down: Tensor, shared: SharedExpert | None, ids: Tensor):
    """A down launcher's shared checks and operands: (N, k, E, H, I, Is, shared down), down[0]
    standing in for the shared down weight when there is no shared expert (Is = 0). ValueError
    unless ids is contiguous [N, k] with act [N, k + 1, ·]."""
    n, k = act.shape[0], act.shape[1] - 1
    if tuple(ids.shape) != (n, k) or not ids.is_contiguous():
        raise ValueError(f"{fn}: ids must be contiguous [N, k] = {(n, k)}, got {tuple(ids.shape)} "
                         f"with strides {ids.stride()}")
    i_s = shared.down.shape[1] if shared is not None else 0
    return (n, k, *down.shape, i_s, shared.down if shared is not None else down[0])
