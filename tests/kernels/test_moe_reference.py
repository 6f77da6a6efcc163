"""The MoE references against the float64 per-token oracle, and their argument checks."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.moe import moe_experts, moe_experts_sync_free
from tests.kernels.moe_cases import NoHostRead, expert_parts, moe_inputs, moe_oracle
from tests.tolerance import assert_close

CASES = {  # (N, k, E, H, I, Is, routing)
    "decode": (1, 2, 16, 48, 24, 24, {}),
    "verify": (16, 8, 64, 40, 16, 32, {}),
    "one-expert": (9, 3, 8, 32, 8, 8, {"one_expert": 5}),
    "all-distinct": (6, 4, 24, 24, 12, 0, {"all_distinct": True}),
}


@pytest.mark.parametrize("impl", [moe_experts, moe_experts_sync_free], ids=["loop", "sync-free"])
@pytest.mark.parametrize("case", CASES)
def test_reference_equals_the_float64_oracle(impl, case):
    n, k, e, h, i, i_s, route = CASES[case]
    args = moe_inputs(n, k, e, h, i, i_s, **route)
    assert_close(case, moe_oracle(**args), impl(**args), 1e-6)


@pytest.mark.parametrize("impl", [moe_experts, moe_experts_sync_free], ids=["loop", "sync-free"])
@pytest.mark.parametrize("within", [None, (16, 32)])
def test_expert_parallel_parts_sum_to_the_whole_call(impl, within):
    """Each of 4 processes holds a quarter of the experts and ignores the assignments to the others;
    with every token routed within [16, 32) processes 2 and 3 hold none of the call's experts and
    return zeros (the shared expert is process 0's)."""
    args = moe_inputs(16, 8, 64, 40, 16, 32, within=within)
    parts = [impl(**part) for part in expert_parts(args, 4)]
    assert_close(f"within {within}", moe_oracle(**args), torch.stack(parts).sum(0), 1e-6)
    assert all(p.any() for p in parts[: 2 if within else 4])
    if within:
        assert not parts[2].any() and not parts[3].any()


def test_sync_free_reference_reads_nothing_back_and_the_loop_does():
    args = moe_inputs(4, 2, 8, 16, 8, 8)
    with NoHostRead():
        moe_experts_sync_free(**args)
    with pytest.raises(AssertionError, match="host read"), NoHostRead():
        moe_experts(**args)


@pytest.mark.parametrize("field, value, message", [
    ("ids", torch.zeros(3, 2), "ids has dtype"),
    ("weights", torch.zeros(3, 3), "weights has shape"),
    ("gate_up", torch.zeros(4, 15, 16), "gate_up has shape"),
    ("down", torch.zeros(4, 16, 9), "down has shape"),
])
def test_bad_arguments_are_named(field, value, message):
    args = moe_inputs(3, 2, 4, 16, 8, 0)
    args[field] = value
    with pytest.raises(ValueError, match=message):
        moe_experts(**args)
