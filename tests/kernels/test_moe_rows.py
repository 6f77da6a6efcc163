"""The register-slice MoE kernels (`gate_up_rows.py`, `down_rows.py`, under TRITON_INTERPRET=1 on
CPU tensors) against the float64 oracle: one to four tokens, k in {1, 2, 8, 10}, awkward widths
(non-powers of two, slices wider than a width), two tokens on one expert, the shared expert alone,
expert-parallel parts, bf16 and fp32; every output written (memory poisoned with NaN); no host
read; and the tuning table's guard on the token count. Every test runs both forms of the down
launch: the call's slices in one load (ids read before the wait), and one assignment at a time."""

from __future__ import annotations

from types import MappingProxyType

import pytest
import torch

from hybridspec.kernels.moe import moe_experts as reference_moe
from tests.kernels.moe_cases import NoHostRead, expert_parts, moe_inputs, moe_oracle, poisoned_allocations
from tests.tolerance import assert_close

pytest.importorskip("triton")

from hybridspec.kernels.moe import down_rows  # noqa: E402
from hybridspec.kernels.moe import triton as moe_triton  # noqa: E402
from hybridspec.kernels.moe.tuning import ROWS_MAX_TOKENS, MoETuning, tuning_for  # noqa: E402

RATIO = {torch.float32: 2e-6, torch.bfloat16: 1e-2}
ROWS = MappingProxyType({ROWS_MAX_TOKENS: MoETuning(rows=True), 64: MoETuning()})


@pytest.fixture(autouse=True, params=["one load", "one at a time"])
def down_form(request, monkeypatch):
    """The down launch's form: the shipped bound (every call here fits one load), or none."""
    if request.param == "one at a time":
        monkeypatch.setattr(down_rows, "ONE_LOAD_ELEMENTS", 0)
    return request.param


def test_one_load_takes_the_35b_calls_of_one_and_two_tokens_and_no_122b_call(down_form):
    if down_form == "one load":
        assert down_rows.one_load(1, 8, 1, 512) and down_rows.one_load(2, 8, 2, 512)  # 35B, shipped BH
        assert not down_rows.one_load(1, 8, 1, 1024) and not down_rows.one_load(2, 8, 2, 1024)  # 122B: I = 1024
        assert down_rows.one_load(1, 8, 1, 300)  # I rounds up to 512
        assert not down_rows.one_load(2, 10, 2, 512)  # 80B's k = 10: 32 assignments' rows
    else:
        assert not down_rows.one_load(1, 1, 1, 16)


def _check(name, args, tuning=ROWS):
    with poisoned_allocations():
        got = moe_triton.moe_experts(**args, tuning=tuning)
    ref = moe_oracle(**args)
    assert_close(name, ref, got, RATIO[args["x"].dtype])
    if args["x"].dtype == torch.bfloat16:  # no worse than the PyTorch reference's own rounding
        ref_err = (reference_moe(**args).double() - ref).square().mean().sqrt()
        assert (got.double() - ref).square().mean().sqrt() <= 1.5 * ref_err + 1e-6, name


@pytest.mark.parametrize("n", range(1, ROWS_MAX_TOKENS + 1))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_token_count_of_the_rows_form(n, dtype):
    _check(f"N={n}", moe_inputs(n, 2, 16, 48, 24, 40, dtype=dtype, seed=n))


@pytest.mark.parametrize("n", [1, 2])
def test_the_shipped_table_takes_the_rows_form_for_one_and_two_tokens(n):
    """The shipped slices (one gate and up row, one or two output columns a program) at the 35B
    expert count, top-8, with the shared expert."""
    assert moe_triton.MOE_TUNING[n].rows
    _check(f"shipped N={n}", moe_inputs(n, 8, 256, 64, 32, 32, dtype=torch.bfloat16, seed=n), moe_triton.MOE_TUNING)


@pytest.mark.parametrize("name, shape, route, dtype, tiles", [
    ("k8-E256-bf16", (2, 8, 256, 64, 32, 32), {}, torch.bfloat16, {}),
    ("k10-E512", (1, 10, 512, 48, 16, 16), {}, torch.float32, {}),
    ("k1-no-shared", (3, 1, 8, 32, 16, 0), {}, torch.float32, {}),
    ("awkward-widths-wide-slices", (2, 8, 64, 80, 24, 40), {}, torch.float32,
     {"rows_bn": 16, "rows_bh": 32, "rows_warps": 2}),
    ("one-expert-bf16", (2, 2, 16, 32, 16, 16), {"one_expert": 7}, torch.bfloat16, {"rows_bn": 4}),
])
def test_shapes_routings_and_slices(name, shape, route, dtype, tiles):
    _check(name, moe_inputs(*shape, dtype=dtype, **route), MappingProxyType({4: MoETuning(rows=True, **tiles)}))


def test_the_shared_expert_alone():
    args = moe_inputs(2, 1, 16, 32, 16, 24, dtype=torch.bfloat16)
    args["ids"].fill_(-1)
    with poisoned_allocations():
        got = moe_triton.moe_experts(**args, tuning=ROWS)
    want = moe_oracle(**{**args, "ids": torch.zeros_like(args["ids"]), "weights": torch.zeros_like(args["weights"])})
    assert_close("shared alone", want, got, RATIO[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_expert_parallel_parts_sum_to_the_whole_call(dtype):
    args = moe_inputs(2, 8, 64, 48, 24, 16, dtype=dtype, seed=3)
    with poisoned_allocations():
        parts = [moe_triton.moe_experts(**part, tuning=ROWS) for part in expert_parts(args, 4)]
    for r, (got, part) in enumerate(zip(parts, expert_parts(args, 4))):
        assert_close(f"part {r}", reference_moe(**part).double(), got.double(), RATIO[dtype])
    assert_close("parts", moe_oracle(**args), torch.stack(parts).double().sum(0), RATIO[dtype])


def test_the_launcher_reads_nothing_back():
    with NoHostRead():
        moe_triton.moe_experts(**moe_inputs(2, 8, 64, 48, 32, 32, dtype=torch.bfloat16), tuning=ROWS)


def test_a_rows_row_serves_a_few_tokens_only():
    assert tuning_for(ROWS_MAX_TOKENS, ROWS).rows and not tuning_for(ROWS_MAX_TOKENS + 1, ROWS).rows
    with pytest.raises(ValueError, match="at most"):
        tuning_for(ROWS_MAX_TOKENS + 1, {16: MoETuning(rows=True)})
    with pytest.raises(ValueError, match="rows_bn"):
        MoETuning(rows_bn=3)
