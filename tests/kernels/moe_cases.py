"""Random MoE inputs and the float64 per-token oracle shared by the MoE kernel tests."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from hybridspec.kernels.moe import SharedExpert


def routing(n: int, k: int, e: int, gen: torch.Generator, *, one_expert: int | None = None,
            all_distinct: bool = False, within: tuple[int, int] | None = None) -> Tensor:
    """ids [n, k] (int64), k distinct per row: random; with every token routing to `one_expert`;
    with every one of the n·k assignments on a different expert (n·k <= e); or random among the
    experts [within[0], within[1]) only."""
    if all_distinct:
        return torch.randperm(e, generator=gen)[: n * k].view(n, k)
    scores = torch.rand(n, e, generator=gen)
    if within is not None:
        scores[:, : within[0]] = scores[:, within[1] :] = -1.0
    if one_expert is not None:
        scores[:, one_expert] = 2.0
    return torch.topk(scores, k, dim=-1).indices


def moe_inputs(n: int, k: int, e: int, h: int, i: int, i_shared: int, dtype=torch.float32, seed: int = 0,
               **route) -> dict:
    """Keyword arguments of `moe_experts`: x, ids, weights, gate_up, down, shared (None if i_shared = 0)."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, fan_in):
        return (torch.randn(*shape, generator=gen) / fan_in ** 0.5).to(dtype)

    ids = routing(n, k, e, gen, **route)
    weights = torch.rand(n, k, generator=gen).softmax(-1).to(dtype)
    shared = None
    if i_shared:
        shared = SharedExpert(rand(i_shared, h, fan_in=h), rand(i_shared, h, fan_in=h), rand(h, i_shared, fan_in=i_shared),
                              rand(1, h, fan_in=h))
    return {"x": rand(n, h, fan_in=1), "ids": ids, "weights": weights, "gate_up": rand(e, 2 * i, h, fan_in=h),
            "down": rand(e, h, i, fan_in=i), "shared": shared}


def moe_oracle(x, ids, weights, gate_up, down, shared=None) -> Tensor:
    """Token by token, assignment by assignment, in float64  [N, H]."""
    x, weights, gate_up, down = x.double(), weights.double(), gate_up.double(), down.double()
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(ids.shape[1]):
            gate, up = (gate_up[ids[n, j]] @ x[n]).chunk(2)
            out[n] += weights[n, j] * (down[ids[n, j]] @ (F.silu(gate) * up))
        if shared is not None:
            gate, up, dn, gw = (t.double() for t in shared)
            out[n] += torch.sigmoid(gw[0] @ x[n]) * (dn @ (F.silu(gate @ x[n]) * (up @ x[n])))
    return out


class NoHostRead(TorchFunctionMode):
    """Fails on every call that copies device values to the host or branches on them."""

    BANNED = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__,
              torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
              torch.Tensor.unique, torch.unique, torch.Tensor.cpu, torch.Tensor.numpy}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.BANNED:
            raise AssertionError(f"host read: {getattr(func, '__name__', func)}")
        return func(*args, **(kwargs or {}))


def expert_parts(args: dict, parts: int) -> list[dict]:
    """`moe_experts` arguments of `parts` processes under expert parallelism: process r holds the
    experts [r·E/parts, (r+1)·E/parts) and the shared expert goes to process 0 alone, so the
    processes' outputs sum to the whole call's."""
    e = args["gate_up"].shape[0] // parts
    return [{**args, "gate_up": args["gate_up"][r * e : (r + 1) * e], "down": args["down"][r * e : (r + 1) * e],
             "shared": args["shared"] if r == 0 else None, "first_expert": r * e} for r in range(parts)]


@contextlib.contextmanager
def poisoned_allocations():
    """`torch.empty` and `torch.empty_like` return NaN-filled floats (ints -7) inside the block, so
    that an output or scratch element a kernel leaves unwritten shows instead of reading as the
    zero a fresh page of memory may hold."""
    empty, empty_like = torch.empty, torch.empty_like

    def poison(t: Tensor) -> Tensor:
        return t.fill_(float("nan") if t.dtype.is_floating_point else -7)

    torch.empty = lambda *a, **k: poison(empty(*a, **k))
    torch.empty_like = lambda *a, **k: poison(empty_like(*a, **k))
    try:
        yield
    finally:
        torch.empty, torch.empty_like = empty, empty_like
