"""The MoE block (`runtime/layers/moe.py`): `forward` is `route` then `run_experts`; from
`shared_beside_from` tokens on the shared expert runs as a call of its own (the expert kernels with no routed
expert held) and is added to the routed experts' call: the same ids and, within rounding, the same
output, on the reference and on the Triton kernels (interpreted), whole and under expert
parallelism. The CUDA streams it forks and joins are checked on the GPU (`tests/gpu/test_moe.py`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridspec.kernels.moe import reference as moe_reference
from hybridspec.runtime.layers.moe import SparseMoE
from hybridspec.runtime.loading import target_config
from tests.tolerance import assert_close

pytest.importorskip("triton")
from hybridspec.kernels.moe import triton as moe_triton  # noqa: E402

OPS = {"torch": moe_reference.moe_experts, "triton": moe_triton.moe_experts}


def _block(experts_op, expert_parallel: bool, dtype: torch.dtype) -> SparseMoE:
    cfg = target_config("random-tiny")
    if expert_parallel:  # this process holds the second half of the experts
        cfg = dataclasses.replace(cfg, expert_shards=2)
    gen = torch.Generator().manual_seed(3)
    block = SparseMoE(cfg, experts_op)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
    block.first_expert = cfg.local_experts if expert_parallel else 0
    return block.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["whole", "experts"])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_shared_expert_beside_equals_its_slot(backend, expert_parallel, dtype):
    block = _block(OPS[backend], expert_parallel, dtype)
    x = torch.randn(1, 5, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(4)).to(dtype)
    slot, slot_ids = block(x)
    ids, weights = block.route(x)
    assert torch.equal(slot_ids, ids) and torch.equal(slot, block.run_experts(x, ids, weights))
    calls = []

    def recorded(x, ids, weights, gate_up, down, shared, **kwargs):
        calls.append(shared is None or bool((ids < 0).all()))  # a call of the beside path
        return OPS[backend](x, ids, weights, gate_up, down, shared, **kwargs)

    block.experts_op = recorded
    block.shared_beside_from = 6  # a 5-token call stays as it was: one call with the shared expert's slot
    assert torch.equal(block(x)[0], slot) and calls == [False]
    block.shared_beside_from = 5  # from 5 tokens on: the shared expert's call and the routed experts' call
    calls.clear()
    beside, beside_ids = block(x)
    assert calls == [True, True]
    assert torch.equal(beside_ids, ids)
    assert_close(f"{backend} {dtype}", slot.double(), beside.double(), 2e-6 if dtype == torch.float32 else 1e-2)
    if expert_parallel:  # some of the assignments go to the experts held here, not all of them
        assert 0 < (ids >= block.first_expert).sum() < ids.numel()
