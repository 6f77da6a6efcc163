"""The device benchmarks' variant tables, checked on the CPU before any device time is spent on
them: every `bench/gpu_round.py` variant sets only attributes that its modules already have (a
misspelt one would time the shipped code under the variant's name) and puts every one back, and
a combination whose parts set one attribute is refused; every MoE sweep row of
`bench/kernels/moe_kernels.py` is a valid tuning table, and every down-launch row names a form."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from hybridspec.kernels.moe.tuning import MoETuning  # noqa: E402
from hybridspec.runtime.loading import load_target  # noqa: E402
from tests.checkpoints import write_tiny_qwen3_5_moe  # noqa: E402

gpu_round = pytest.importorskip("bench.gpu_round")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = write_tiny_qwen3_5_moe(tmp_path_factory.mktemp("variants"), num_hidden_layers=4,
                                       full_attention_interval=2)
    return load_target(directory, backend="triton")


@pytest.mark.parametrize("name", [*gpu_round.VARIANTS, "prepare-ref+no-pdl+torch-sampling"])
def test_each_variant_sets_existing_attributes_and_puts_them_back(target, name):
    parts = name.split("+")
    undo = gpu_round.apply_variant(target, name)
    expected = sum(len(attrs) * (sum(isinstance(m, key) for m in target.modules()) if isinstance(key, type) else 1)
                   for part in parts for key, attrs in gpu_round.VARIANTS[part].items())
    assert len(undo) == expected
    for owner, attr, _ in undo:
        assert attr in vars(owner) or hasattr(type(owner), attr), (owner, attr)
    changed = [(owner, attr) for owner, attr, before in undo if getattr(owner, attr) is not before]
    assert name == "shipped" or changed, "the variant changed nothing"
    for owner, attr, before in undo:
        setattr(owner, attr, before)
    assert all(getattr(owner, attr) is before for owner, attr, before in undo)


def test_two_parts_setting_one_attribute_are_refused_before_anything_is_set(target):
    before = gpu_round.moe_router.ROUTER_TILES
    with pytest.raises(ValueError, match="both set ROUTER_TILES"):
        gpu_round.apply_variant(target, "two-step-topk+router-tiles")
    assert gpu_round.moe_router.ROUTER_TILES is before


def test_the_moe_sweep_rows_are_tuning_tables():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
    moe_kernels = pytest.importorskip("moe_kernels")
    if not moe_kernels.SWEEP:
        pytest.skip("the MoE sweep has no rows now")
    for name, table in moe_kernels.SWEEP.items():
        assert table and all(isinstance(k, int) and isinstance(v, MoETuning) for k, v in table.items()), name
        assert max(table) >= 64, f"{name}: calls of up to 64 tokens need a row"


def test_the_down_sweep_rows_change_the_down_launch():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))
    moe_kernels = pytest.importorskip("moe_kernels")
    for name, (elements, block_h, warps) in moe_kernels.DOWN_SWEEP.items():
        assert (elements, block_h, warps) != (None, None, None), f"{name} times the shipped launch"
        assert elements is None or elements >= 0
        assert block_h is None or block_h & (block_h - 1) == 0
        assert warps in (None, 1, 2, 4, 8)
