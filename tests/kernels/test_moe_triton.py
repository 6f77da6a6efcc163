"""The Triton MoE kernels (under TRITON_INTERPRET=1 on CPU tensors) against the float64 oracle:
every verification length, k in {2, 8, 10}, E up to 512, awkward widths, skewed and spread
routing, prefill pieces, bf16 and fp32; the device-side expert slots; no host read."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.moe import moe_experts as reference_moe
from tests.kernels.moe_cases import NoHostRead, expert_parts, moe_inputs, moe_oracle, poisoned_allocations
from tests.tolerance import assert_close

pytest.importorskip("triton")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from hybridspec.kernels.moe import triton as moe_triton  # noqa: E402
from hybridspec.kernels.moe.routing import expert_slots, workspace_size  # noqa: E402
from hybridspec.kernels.moe.tiles import assignment_expert  # noqa: E402
from hybridspec.kernels.moe.tuning import MoETuning  # noqa: E402

RATIO = {torch.float32: 2e-6, torch.bfloat16: 1e-2}


def _check(name, args, **kw):
    got = moe_triton.moe_experts(**args, **kw)
    ref = moe_oracle(**args)
    assert_close(name, ref, got, RATIO[args["x"].dtype])
    if args["x"].dtype == torch.bfloat16:  # no worse than the PyTorch reference's own rounding
        ref_err = (reference_moe(**args).double() - ref).square().mean().sqrt()
        assert (got.double() - ref).square().mean().sqrt() <= 1.5 * ref_err + 1e-6, name


@pytest.mark.parametrize("n", range(1, 17))
def test_every_verification_length(n):
    _check(f"N={n}", moe_inputs(n, 2, 16, 48, 24, 40, seed=n))


@pytest.mark.parametrize("name, shape, route, dtype", [
    ("k8-E256-bf16", (16, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("k10-E512", (12, 10, 512, 48, 16, 16), {}, torch.float32),
    ("k8-awkward-widths", (5, 8, 64, 80, 24, 40), {}, torch.float32),
    ("one-expert-bf16", (16, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.bfloat16),
    ("all-distinct", (16, 8, 128, 32, 16, 0), {"all_distinct": True}, torch.float32),
    ("prefill-one-piece", (40, 2, 16, 32, 16, 16), {}, torch.float32),
    ("prefill-two-pieces", (70, 2, 16, 32, 16, 24), {}, torch.bfloat16),
])
def test_shapes_and_routings(name, shape, route, dtype):
    _check(name, moe_inputs(*shape, dtype=dtype, **route))


@pytest.mark.parametrize("name, shape, route, dtype", [
    ("spread-bf16", (6, 8, 64, 48, 24, 16), {}, torch.bfloat16),
    ("within-one-quarter", (5, 2, 16, 32, 16, 16), {"within": (4, 8)}, torch.float32),
])
def test_expert_parallel_parts_sum_to_the_whole_call(name, shape, route, dtype):
    """4 processes, a quarter of the experts each, the shared expert on process 0 only: the parts
    sum to the whole call. With every token routed within [4, 8) process 0 runs only its shared
    expert, and processes 2 and 3, holding none of the call's experts and no shared expert, return
    zeros (nothing arrives at their down kernel's counters). Allocations are poisoned with NaN."""
    args = moe_inputs(*shape, dtype=dtype, **route)
    with poisoned_allocations():  # an unwritten output or partial row reads as NaN, not as a lucky zero
        parts = [moe_triton.moe_experts(**part) for part in expert_parts(args, 4)]
    want = [reference_moe(**part) for part in expert_parts(args, 4)]
    for r, (got, ref) in enumerate(zip(parts, want)):
        assert_close(f"{name} part {r}", ref.double(), got.double(), RATIO[dtype])
    assert_close(name, moe_oracle(**args), torch.stack(parts).double().sum(0), RATIO[dtype])
    if "within" in route:
        assert not parts[2].any() and not parts[3].any()


INLINE = {64: MoETuning(inline_slots=True)}


@pytest.mark.parametrize("name, shape, route, dtype", [
    ("one-token", (1, 2, 16, 48, 24, 40), {}, torch.float32),
    ("k8-E256-bf16", (16, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("k10-E512", (12, 10, 512, 48, 16, 16), {}, torch.float32),
    ("one-expert-bf16", (16, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.bfloat16),
    ("all-distinct-no-shared", (16, 8, 128, 32, 16, 0), {"all_distinct": True}, torch.float32),
    ("prefill-two-pieces", (70, 2, 16, 32, 16, 24), {}, torch.bfloat16),
])
def test_inline_slots_equal_the_slots_launch_bit_for_bit(name, shape, route, dtype):
    """`MoETuning.inline_slots`: each expert program takes its expert from the ids (an expert's
    first assignment runs it) and gate_up zeroes the down kernel's counters, with no slots launch:
    the same products and the same sums as the three launches, bit for bit, on memory poisoned with
    NaN (ints −7: counters left unzeroed never complete a column tile, so its output stays NaN)."""
    args = moe_inputs(*shape, dtype=dtype, **route)
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args)
        got = moe_triton.moe_experts(**args, tuning=INLINE)
    assert torch.equal(got, want), name


@pytest.mark.parametrize("route", [{}, {"within": (4, 8)}])
def test_inline_slots_expert_parallel_parts_equal_the_slots_launches(route):
    """Under expert parallelism the assignments to experts held elsewhere run nowhere here; a part
    holding none of the call's experts and no shared expert still completes every column tile (all
    program rows arrive) and returns zeros."""
    args = moe_inputs(5, 2, 16, 32, 16, 16, dtype=torch.float32, **route)
    with poisoned_allocations():
        want = [moe_triton.moe_experts(**part) for part in expert_parts(args, 4)]
        got = [moe_triton.moe_experts(**part, tuning=INLINE) for part in expert_parts(args, 4)]
    for r, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), r
    if route:
        assert not got[2].any() and not got[3].any()


@triton.jit
def _assignment_rows(ids_ptr, e_ptr, kpos_ptr, active_ptr, N, FIRST, E, K: tl.constexpr, BM: tl.constexpr,
                     NKP: tl.constexpr, KP: tl.constexpr):
    i_s = tl.program_id(0)
    e, b_kpos, active = assignment_expert(ids_ptr, i_s, N, FIRST, E, K, BM, NKP, KP)
    tl.store(e_ptr + i_s, e)
    tl.store(kpos_ptr + i_s * BM + tl.arange(0, BM), b_kpos)
    tl.store(active_ptr + i_s, active.to(tl.int32))


@pytest.mark.parametrize("first, held", [(0, 16), (4, 8)])
def test_assignment_expert_runs_each_held_expert_in_its_first_assignments_row(first, held):
    """`tiles.assignment_expert` for every program row of a call: active exactly in the row of each
    held expert's first assignment (so its weights are read once), the expert's local id, and each
    token's position of that expert among its k (or −1)."""
    n, k = 6, 3
    ids = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(r))[:k] for r in range(n)])
    e = torch.empty(n * k, dtype=torch.long)
    kpos = torch.empty(n * k, 16, dtype=torch.int32)
    active = torch.empty(n * k, dtype=torch.int32)
    _assignment_rows[(n * k,)](ids, e, kpos, active, n, first, held, K=k, BM=16, NKP=32, KP=4)
    flat = ids.flatten().tolist()
    for s, expert in enumerate(flat):
        local = expert - first
        assert e[s] == local
        assert bool(active[s]) == (0 <= local < held and expert not in flat[:s]), s
        want = [row.index(expert) if expert in row else -1 for row in ids.tolist()] + [-1] * (16 - n)
        assert kpos[s].tolist() == want, s


@pytest.mark.parametrize("n", [1, 5])
def test_inline_slots_run_the_shared_expert_alone(n):
    """The shared expert's own call (`SparseMoE.shared_beside_from`: ids all −1, one column): no
    routed expert runs, every row still arrives, and the output is the three launches' bit for bit."""
    args = moe_inputs(n, 1, 16, 32, 16, 24, dtype=torch.bfloat16)
    args["ids"].fill_(-1)
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args)
        got = moe_triton.moe_experts(**args, tuning=INLINE)
    assert torch.isfinite(want).all() and torch.equal(got, want)


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("name, shape, route, dtype", [
    ("one-token", (1, 2, 16, 48, 24, 40), {}, torch.float32),
    ("k8-E256-bf16", (16, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("shared-narrower", (3, 8, 64, 48, 40, 16), {}, torch.bfloat16),
    ("one-expert", (16, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.float32),
    ("all-distinct-no-shared", (16, 8, 128, 32, 16, 0), {"all_distinct": True}, torch.bfloat16),
    ("prefill-two-pieces", (70, 2, 16, 32, 16, 24), {}, torch.bfloat16),
])
def test_down_early_weights_equal_the_shipped_launches_bit_for_bit(inline, name, shape, route, dtype):
    """`MoETuning.down_early_weights`: the down programs take their expert and its first weight tile
    (the shared expert's in the last row) before the wait, then the same steps: bit for bit the
    shipped result, with the slots launch or inline, on NaN-poisoned memory."""
    args = moe_inputs(*shape, dtype=dtype, **route)
    early = {64: MoETuning(inline_slots=inline, down_early_weights=True)}
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args)
        got = moe_triton.moe_experts(**args, tuning=early)
    assert torch.equal(got, want), name


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("shape", [(3, 4, 32, 40, 48, 40), (2, 4, 32, 40, 40, 48), (5, 2, 16, 40, 48, 0)],
                         ids=["I>Is", "I<Is", "no-shared"])
def test_down_early_weights_with_several_steps_and_column_tiles(inline, shape):
    """Tiles of 16 × 16: the early tile is the first of several steps over the intermediate width
    (the routed and the shared expert's of different widths) in each of three column tiles, then the
    loop goes on from the second step: bit for bit the same tiles read after the wait."""
    args = moe_inputs(*shape, dtype=torch.bfloat16)
    small = dict(down_bh=16, down_bk=16, inline_slots=inline)
    with poisoned_allocations():
        want = moe_triton.moe_experts(**args, tuning={64: MoETuning(**small)})
        got = moe_triton.moe_experts(**args, tuning={64: MoETuning(**small, down_early_weights=True)})
    assert torch.isfinite(want).all() and torch.equal(got, want)


@pytest.mark.parametrize("inline", [False, True])
def test_down_early_weights_expert_parallel_parts(inline):
    """Under expert parallelism with the early read: the parts equal the shipped parts, and the two
    parts holding none of the call's experts (and no shared expert) return zeros."""
    args = moe_inputs(5, 2, 16, 32, 16, 16, dtype=torch.float32, within=(4, 8))
    early = {64: MoETuning(inline_slots=inline, down_early_weights=True)}
    with poisoned_allocations():
        want = [moe_triton.moe_experts(**part) for part in expert_parts(args, 4)]
        got = [moe_triton.moe_experts(**part, tuning=early) for part in expert_parts(args, 4)]
    for r, (g, w) in enumerate(zip(got, want)):
        assert torch.equal(g, w), r
    assert not got[2].any() and not got[3].any()


@pytest.mark.parametrize("inline", [False, True])
@pytest.mark.parametrize("name, shape, route, dtype", [
    ("one-token", (1, 2, 16, 48, 24, 40), {}, torch.float32),
    ("k8-E256-bf16", (16, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("shared-narrower", (3, 8, 64, 48, 40, 16), {}, torch.bfloat16),
    ("shared-wider-16-tiles", (2, 4, 32, 40, 40, 48), {}, torch.bfloat16),
    ("no-shared", (5, 2, 16, 40, 48, 0), {}, torch.bfloat16),
])
def test_gate_up_shared_early_equals_the_shipped_launches_bit_for_bit(inline, name, shape, route, dtype):
    """`MoETuning.gate_up_shared_early`: the shared expert's programs form their products before the
    wait and store after it; the routed programs as shipped: bit for bit the shipped result (tiles
    of 16 × 16 as well, several steps and column tiles), on NaN-poisoned memory. The interpreter
    runs no programmatic-dependent launch: this checks the restructured arithmetic; the order
    around the wait runs in `tests/gpu/test_moe.py`."""
    args = moe_inputs(*shape, dtype=dtype, **route)
    for small in ({}, dict(gate_up_bn=16, gate_up_bk=16)):
        with poisoned_allocations():
            want = moe_triton.moe_experts(**args, tuning={64: MoETuning(inline_slots=inline, **small)})
            got = moe_triton.moe_experts(**args, tuning={64: MoETuning(inline_slots=inline, gate_up_shared_early=True,
                                                                       **small)})
        assert torch.isfinite(want).all() and torch.equal(got, want), (name, small)


def test_inline_slots_read_nothing_back():
    args = moe_inputs(4, 8, 64, 48, 32, 32, dtype=torch.bfloat16)
    with NoHostRead():
        moe_triton.moe_experts(**args, tuning=INLINE)


def test_tuning_is_taken_as_given():
    args = moe_inputs(6, 2, 16, 80, 40, 24)
    tuning = {64: MoETuning(gate_up_bn=16, gate_up_bk=32, down_bh=32, down_bk=16, down_stages=1)}
    _check("small tiles", args, tuning=tuning)


def test_expert_slots_are_the_sorted_distinct_experts_with_each_tokens_position_and_zeroed_arrivals():
    args = moe_inputs(7, 3, 20, 8, 8, 0, seed=3)
    ids = args["ids"]
    n, k = ids.shape
    workspace = torch.full((workspace_size(n, k, 20, 16, 3),), -7, dtype=torch.int32)
    slot_expert, slot_kpos, count, arrivals = expert_slots(ids, workspace, 20, 16, 3)
    assert arrivals.tolist() == [0, 0, 0]
    distinct = torch.unique(ids)
    assert count.tolist() == [len(distinct)]
    assert slot_expert[: len(distinct)].tolist() == distinct.tolist()
    for s, expert in enumerate(distinct.tolist()):
        for t in range(16):
            hits = (ids[t] == expert).nonzero().flatten().tolist() if t < n else []
            assert slot_kpos[s, t].item() == (hits[0] if hits else -1), (s, t)


def test_expert_slots_leave_out_the_experts_held_elsewhere():
    """Experts [8, 16) of 20 held here: slots index those 8, assignments to the others have none."""
    args = moe_inputs(7, 3, 20, 8, 8, 0, seed=3)
    ids = args["ids"]
    n, k = ids.shape
    workspace = torch.full((workspace_size(n, k, 8, 16, 3),), -7, dtype=torch.int32)
    slot_expert, slot_kpos, count, _ = expert_slots(ids, workspace, 8, 16, 3, first_expert=8)
    held = [int(e) - 8 for e in torch.unique(ids) if 8 <= e < 16]
    assert count.tolist() == [len(held)]
    assert slot_expert[: len(held)].tolist() == held
    for s in range(n * k):  # every slot row: the token's position of its held expert, -1 elsewhere
        for t in range(16):
            hits = (ids[t] == held[s] + 8).nonzero().flatten().tolist() if s < len(held) and t < n else []
            assert slot_kpos[s, t].item() == (hits[0] if hits else -1), (s, t)


def test_the_launcher_reads_nothing_back():
    args = moe_inputs(5, 2, 16, 32, 16, 16)
    with NoHostRead():
        moe_triton.moe_experts(**args)


def test_bad_layouts_are_named():
    args = moe_inputs(3, 2, 8, 32, 16, 16)
    with pytest.raises(ValueError, match="down has dtype"):
        moe_triton.moe_experts(**{**args, "down": args["down"].double()})
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        moe_triton.moe_experts(**{**args, "gate_up": args["gate_up"].transpose(1, 2).contiguous().transpose(1, 2)})
