"""The MoE block (`runtime/layers/moe.py`): `forward` routes, then sums the held experts' outputs and
the gated shared expert, equal to the float64 oracle on the block's own weights, on the reference
and on the Triton kernels (interpreted), whole and under expert parallelism (only the experts held
here add)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hybridspec.kernels.moe import reference as moe_reference
from hybridspec.runtime.layers.moe import SparseMoE
from hybridspec.runtime.loading import target_config
from tests.kernels.moe_cases import moe_oracle
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
def test_forward_routes_then_sums_the_held_experts_and_the_shared_one(backend, expert_parallel, dtype):
    block = _block(OPS[backend], expert_parallel, dtype)
    x = torch.randn(1, 5, block.gate.weight.shape[1], generator=torch.Generator().manual_seed(4)).to(dtype)
    out, out_ids = block(x)
    ids, weights = block.route(x)
    assert torch.equal(out_ids, ids)
    local = ids[0] - block.first_expert  # [5, k]: this process's expert index, where it holds the expert
    held = (local >= 0) & (local < block.experts.gate_up_proj.shape[0])
    if expert_parallel:  # some of the assignments go to the experts held here, not all of them
        assert 0 < held.sum() < held.numel()
    want = moe_oracle(x[0], torch.where(held, local, 0), torch.where(held, weights[0], 0), block.experts.gate_up_proj,
                      block.experts.down_proj, block.shared())
    assert_close(f"{backend} {dtype}", want, out[0], 1e-2 if dtype == torch.bfloat16 else 1e-5)
