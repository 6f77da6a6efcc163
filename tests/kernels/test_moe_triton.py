"""The Triton MoE kernels (under TRITON_INTERPRET=1 on CPU tensors) against the float64 oracle:
every verification length, k in {2, 8, 10}, E up to 512, awkward widths, skewed and spread
routing, prefill pieces, bf16 and fp32, expert-parallel parts, the shared expert alone, each
program row's expert from the ids (`tiles.assignment_expert`); no host read. The launches run on
memory poisoned with NaN (ints −7), so an output, a partial row or an arrival counter the kernels
leave unwritten shows."""

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
from hybridspec.kernels.moe.tiles import assignment_expert  # noqa: E402
from hybridspec.kernels.moe.tuning import MoETuning  # noqa: E402

RATIO = {torch.float32: 2e-6, torch.bfloat16: 1e-2}


def _check(name, args, **kw):
    with poisoned_allocations():  # counters left unzeroed never complete a column tile: NaN output
        got = moe_triton.moe_experts(**args, **kw)
    ref = moe_oracle(**args)
    assert_close(name, ref, got, RATIO[args["x"].dtype])
    if args["x"].dtype == torch.bfloat16:  # no worse than the PyTorch reference's own rounding
        ref_err = (reference_moe(**args).double() - ref).square().mean().sqrt()
        assert (got.double() - ref).square().mean().sqrt() <= 1.5 * ref_err + 1e-6, name


@pytest.mark.parametrize("n", range(1, 17))
def test_every_verification_length(n):
    _check(f"N={n}", moe_inputs(n, 2, 16, 48, 24, 40, seed=n))


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tile_kernels_at_one_and_two_tokens(n, dtype):
    """The shipped table sends one and two tokens to the register-slice kernels; the tile kernels
    still serve them under a table without `rows` (the bench's `moe-tiles`)."""
    _check(f"tiles N={n}", moe_inputs(n, 8, 64, 48, 24, 40, dtype=dtype, seed=n), tuning={64: MoETuning()})


@pytest.mark.parametrize("name, shape, route, dtype", [
    ("k8-E256-bf16", (16, 8, 256, 64, 32, 32), {}, torch.bfloat16),
    ("k10-E512", (12, 10, 512, 48, 16, 16), {}, torch.float32),
    ("k8-awkward-widths", (5, 8, 64, 80, 24, 40), {}, torch.float32),
    ("one-expert-bf16", (16, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.bfloat16),
    ("all-distinct", (16, 8, 128, 32, 16, 0), {"all_distinct": True}, torch.float32),
    ("prefill-24-bf16", (24, 8, 64, 64, 32, 32), {}, torch.bfloat16),
    ("prefill-one-piece", (40, 2, 16, 32, 16, 16), {}, torch.float32),
    ("prefill-two-pieces", (70, 2, 16, 32, 16, 24), {}, torch.bfloat16),
    ("prefill-three-pieces-no-shared", (130, 4, 32, 24, 16, 0), {}, torch.float32),
])
def test_shapes_and_routings(name, shape, route, dtype):
    _check(name, moe_inputs(*shape, dtype=dtype, **route))


@pytest.mark.parametrize("name, shape, route, dtype", [
    ("spread-bf16", (6, 8, 64, 48, 24, 16), {}, torch.bfloat16),
    ("mixed-fp32", (6, 4, 16, 32, 40, 24), {}, torch.float32),
    ("within-one-quarter", (5, 2, 16, 32, 16, 16), {"within": (4, 8)}, torch.float32),
    ("prefill-two-pieces", (70, 2, 16, 32, 16, 16), {}, torch.float32),
])
def test_expert_parallel_parts_sum_to_the_whole_call(name, shape, route, dtype):
    """4 processes, a quarter of the experts each, the shared expert on process 0 only: the parts
    sum to the whole call, tokens mixing experts held here and elsewhere. With every token routed
    within [4, 8) process 0 runs only its shared expert, and processes 2 and 3, holding none of the
    call's experts and no shared expert, return zeros (every program row still arrives at their
    down kernel's counters; the last arrival stores the empty sum). Allocations are poisoned with
    NaN."""
    args = moe_inputs(*shape, dtype=dtype, seed=3, **route)
    quarter = args["gate_up"].shape[0] // 4
    if "within" not in route:  # the premise: some token's experts are held by different parts
        assert any(len(set((row // quarter).tolist())) > 1 for row in args["ids"]), name
    with poisoned_allocations():  # an unwritten output or partial row reads as NaN, not as a lucky zero
        parts = [moe_triton.moe_experts(**part) for part in expert_parts(args, 4)]
    want = [reference_moe(**part) for part in expert_parts(args, 4)]
    for r, (got, ref) in enumerate(zip(parts, want)):
        assert_close(f"{name} part {r}", ref.double(), got.double(), RATIO[dtype])
    assert_close(name, moe_oracle(**args), torch.stack(parts).double().sum(0), RATIO[dtype])
    if "within" in route:
        assert not parts[2].any() and not parts[3].any()


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
def test_the_shared_expert_alone(n):
    """A call whose assignments are all held by no process (ids all −1, as under expert parallelism;
    one column): no routed expert runs, every program row still arrives, and the output is the
    shared expert's (the oracle with routing weights of zero)."""
    args = moe_inputs(n, 1, 16, 32, 16, 24, dtype=torch.bfloat16)
    args["ids"].fill_(-1)
    with poisoned_allocations():
        got = moe_triton.moe_experts(**args)
    want = moe_oracle(**{**args, "ids": torch.zeros_like(args["ids"]), "weights": torch.zeros_like(args["weights"])})
    assert torch.isfinite(got).all()
    assert_close(f"N={n}", want, got, RATIO[torch.bfloat16])


def test_tuning_is_taken_as_given():
    args = moe_inputs(6, 2, 16, 80, 40, 24)
    tuning = {64: MoETuning(gate_up_bn=16, gate_up_bk=32, down_bh=32, down_bk=16, down_stages=1)}
    _check("small tiles", args, tuning=tuning)


@pytest.mark.parametrize("shape", [(5, 2, 16, 32, 16, 16), (4, 8, 64, 48, 32, 32)], ids=["k2", "k8"])
def test_the_launcher_reads_nothing_back(shape):
    args = moe_inputs(*shape, dtype=torch.bfloat16)
    with NoHostRead():
        moe_triton.moe_experts(**args)


def test_bad_layouts_are_named():
    args = moe_inputs(3, 2, 8, 32, 16, 16)
    with pytest.raises(ValueError, match="down has dtype"):
        moe_triton.moe_experts(**{**args, "down": args["down"].double()})
    with pytest.raises(ValueError, match="gate_up must be contiguous"):
        moe_triton.moe_experts(**{**args, "gate_up": args["gate_up"].transpose(1, 2).contiguous().transpose(1, 2)})
