"""The down half by column tile (`MoETuning.down_columns`, under TRITON_INTERPRET=1 on CPU tensors):
bit for bit the shipped launches' result (the same tile products over the same steps, summed in the
same order), on NaN-poisoned memory, with the slots launch and inline, with the early first tile,
under expert parallelism, and, for a token, whatever the other tokens of its call. The interpreter
runs no programmatic-dependent launch, so these check the arithmetic of the early reads, not their
order around the wait: `tests/gpu/test_moe.py` runs the same switches compiled, PDL on."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.moe_cases import NoHostRead, expert_parts, moe_inputs, moe_oracle, poisoned_allocations
from tests.tolerance import assert_close

pytest.importorskip("triton")

from hybridspec.kernels.moe import triton as moe_triton  # noqa: E402
from hybridspec.kernels.moe.tuning import MoETuning  # noqa: E402

CASES = [
    ("one-token", (1, 2, 16, 48, 24, 40), {}, torch.float32),
    ("one-token-k8-E256-bf16", (1, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("two-tokens-shared-narrower", (2, 8, 64, 48, 40, 16), {}, torch.bfloat16),
    ("four-tokens-one-expert", (4, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.float32),
    ("sixteen-all-distinct-no-shared", (16, 4, 128, 32, 16, 0), {"all_distinct": True}, torch.bfloat16),
]


def _columns(**kw) -> dict:
    return {64: MoETuning(down_columns=True, down_bh=16, **kw)}


@pytest.mark.parametrize("n", [1, 2, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_down_columns_equal_the_float64_oracle(n, dtype):
    """The whole call with the column kernel against the per-token float64 reference
    (`moe_cases.moe_oracle`) on fresh random inputs with awkward widths: within the precision of
    the inputs."""
    args = moe_inputs(n, 4, 32, 40, 24, 40, dtype=dtype, seed=10 + n)
    got = moe_triton.moe_experts(**args, tuning=_columns(down_bk=16))
    assert_close(f"N={n} {dtype}", moe_oracle(**args), got, 2e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("name, shape, route, dtype", CASES)
def test_down_columns_equal_the_shipped_launches_bit_for_bit(inline, early, name, shape, route, dtype):
    args = moe_inputs(*shape, dtype=dtype, **route)
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args)
        got = moe_triton.moe_experts(**args, tuning=_columns(inline_slots=inline, down_early_weights=early))
    assert torch.isfinite(want).all() and torch.equal(got, want), name


@pytest.mark.parametrize("early", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 32, 40, 48, 40), (2, 4, 32, 40, 40, 48), (5, 2, 16, 40, 48, 0)],
                         ids=["I>Is", "I<Is", "no-shared"])
def test_down_columns_with_several_steps_and_column_tiles(early, shape):
    """Tiles of 16 × 16: several steps over intermediate widths the tiles do not divide (routed and
    shared of different widths, the flat loop crossing from expert to expert mid-way through a
    token's steps), three column tiles, a last one past the hidden size."""
    args = moe_inputs(*shape, dtype=torch.bfloat16)
    small = dict(down_bh=16, down_bk=16)
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args, tuning={64: MoETuning(**small)})
        got = moe_triton.moe_experts(**args, tuning={64: MoETuning(**small, down_columns=True,
                                                                   down_early_weights=early)})
    assert torch.isfinite(want).all() and torch.equal(got, want)


@pytest.mark.parametrize("early", [False, True])
def test_down_columns_expert_parallel_parts_mixing_held_and_remote_experts(early):
    """Parts of 4 of 16 experts with routing over all 16 and steps of 16 over widths of 40 and 24:
    a token's loop alternates experts held here with experts held elsewhere, each of several steps
    (the remote ones adding zeros at every step), and token 0's first expert, read before the loop,
    is remote in three of the four parts."""
    args = moe_inputs(6, 4, 16, 32, 40, 24, dtype=torch.bfloat16, seed=3)
    small = dict(down_bh=16, down_bk=16)
    with poisoned_allocations():
        want = [moe_triton.moe_experts(**part, tuning={64: MoETuning(**small)}) for part in expert_parts(args, 4)]
        got = [moe_triton.moe_experts(**part, tuning={64: MoETuning(**small, down_columns=True,
                                                                      down_early_weights=early)})
               for part in expert_parts(args, 4)]
    assert any((row // 4 == 0).any() and (row // 4 != 0).any() for row in args["ids"])  # held and remote mixed
    for r, (g, w) in enumerate(zip(got, want)):
        assert torch.isfinite(w).all() and torch.equal(g, w), r


@pytest.mark.parametrize("early", [False, True])
def test_down_columns_expert_parallel_parts(early):
    """Under expert parallelism: each part equals the shipped part (rows of experts held elsewhere
    add nothing), and the parts holding none of the call's experts and no shared expert are zero."""
    args = moe_inputs(5, 2, 16, 32, 16, 16, dtype=torch.float32, within=(4, 8))
    with poisoned_allocations():
        want = [moe_triton.moe_experts(**part) for part in expert_parts(args, 4)]
        got = [moe_triton.moe_experts(**part, tuning=_columns(down_early_weights=early))
               for part in expert_parts(args, 4)]
    for r, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), r
    assert not got[2].any() and not got[3].any()


def test_a_token_alone_and_among_others_gets_the_same_bits():
    """A table that runs the column kernel for one-token calls and the shipped kernels for longer
    ones: each token of a 6-token call equals the token's own one-token call (what lets `ar` and the
    verification passes emit the same tokens)."""
    args = moe_inputs(6, 8, 64, 48, 32, 32, dtype=torch.bfloat16)
    table = {1: MoETuning(down_columns=True, down_bh=16), 64: MoETuning()}
    whole = moe_triton.moe_experts(**args, tuning=table)
    for n in range(6):
        one = {**args, "x": args["x"][n : n + 1], "ids": args["ids"][n : n + 1], "weights": args["weights"][n : n + 1]}
        assert torch.equal(moe_triton.moe_experts(**one, tuning=table)[0], whole[n]), n


def test_down_columns_read_nothing_back():
    args = moe_inputs(2, 8, 64, 48, 32, 32, dtype=torch.bfloat16)
    with NoHostRead():
        moe_triton.moe_experts(**args, tuning=_columns(inline_slots=True))
