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
