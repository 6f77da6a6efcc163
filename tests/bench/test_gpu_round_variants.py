"""The device benchmarks' variant tables, checked on the CPU before any device time is spent on
them: every `bench/gpu_round.py` variant sets only attributes that its modules already have (a
misspelt one would time the shipped code under the variant's name) and puts every one back, and
a combination whose parts set one attribute is refused; a `free-*` variant's replayed op runs
nothing while a graph is captured; every MoE sweep row of `bench/kernels/moe_kernels.py` is a
valid tuning table, and every down-launch row names a form."""

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
    expected = sum(len(attrs) * len(gpu_round.owners_of(target, key))
                   for part in parts for key, attrs in gpu_round.VARIANTS[part].items())
    assert all(gpu_round.owners_of(target, key) for part in parts for key in gpu_round.VARIANTS[part]), name
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


def test_a_replayed_op_runs_outside_capture_and_returns_its_last_output_during_capture(monkeypatch):
    """`free-*` variants: eager calls run the op (and remember its output per input shape and
    argument form); calls while a graph is captured run nothing and return that output."""
    calls = []

    def op(x, weight, eps, residual=None):
        calls.append(x.shape)
        return x * 2, x if residual is None else x + residual

    replayed = gpu_round.replayed(op)
    capturing = False
    monkeypatch.setattr(gpu_round.torch.cuda, "is_current_stream_capturing", lambda: capturing)
    x, r = gpu_round.torch.ones(2, 3), gpu_round.torch.full((2, 3), 5.0)
    plain, added = replayed(x, None, 1e-6), replayed(x, None, 1e-6, r)
    assert len(calls) == 2 and plain[1] is x and gpu_round.torch.equal(added[1], x + r)
    capturing = True
    assert replayed(gpu_round.torch.zeros(2, 3), None, 1e-6) is plain
    assert replayed(gpu_round.torch.zeros(2, 3), None, 1e-6, r) is added
    assert len(calls) == 2
    with pytest.raises(KeyError):  # a shape never run eagerly: nothing to return
        replayed(gpu_round.torch.zeros(4, 3), None, 1e-6)


def test_round_routing_returns_the_full_rounds_routing_and_blocks():
    """`round_routing` (the drafted verification row's input) keeps the rounds of W tokens of a
    `full` decoding: per round each MoE layer's ids [W, k], and its block, the anchor then the drafts."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.session import open_session

    session = open_session()
    engine = Engine(session.target, session.drafter, max_context=512, resident=False)
    W = session.drafter.draft_len + 1
    routings, blocks = gpu_round.round_routing(engine, session.codec.encode("def fibonacci(n):\n    "), W, rounds=3)
    assert len(routings) == len(blocks) == 3
    k = session.target.cfg.num_experts_per_tok
    assert all(ids.shape == (W, k) for layers in routings for ids in layers)
    assert all(len(block) == W and block[0] is not None for block in blocks)


def test_round_trace_rows_follow_the_decoding():
    """`round_trace_rows` gives one row per round of a `full` decoding, the graph path's (here the
    resident round run eagerly) beside the host path's routing: w = W before the budget's tail."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.session import open_session

    session = open_session()
    t, d = session.target, session.drafter
    runs = {"graph": Engine(t, d, max_context=512, resident=True, graphs=False),
            "eager": Engine(t, d, max_context=512, resident=False)}
    W = d.draft_len + 1
    distinct = lambda routing: sum(int(ids.unique().numel()) for ids in routing)  # noqa: E731
    rows = gpu_round.round_trace_rows("embedded", runs, session.codec.encode("def fibonacci(n):\n    "), W, tokens=40,
                                      floor_of=lambda routing: float(distinct(routing)))
    summary = rows.pop()
    assert summary["policy"] == f"round own floor:{W}" and summary["rounds"] == sum(r["w"] == W for r in rows)
    assert all(r["ratio"] == round(r["ms_per_round"] / r["floor_ms"], 3) for r in rows)
    assert [r["round"] for r in rows] == list(range(len(rows))) and rows[0]["w"] == W
    assert sum(r["accepted"] + 1 for r in rows) == 39  # every token after the prefill's
    assert all(0 < r["distinct_experts"] <= session.target.cfg.num_experts for r in rows)


def test_flavour_rows_time_each_request_kind_and_logprobs_keep_the_tokens():
    """`flavour_rows` gives a row per policy and flavour; a request with logprobs emits the plain
    request's tokens (the rows compare round for round), a penalised one is its own decoding."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.session import open_session

    session = open_session()
    runs = {"graph": Engine(session.target, session.drafter, max_context=512, resident=True, graphs=False)}
    flavours = list(gpu_round.FLAVOURS)
    rows = gpu_round.flavour_rows(session, "embedded", runs, session.codec.encode("def fibonacci(n):\n    "),
                                  ["ar", "full"], 24, flavours)
    assert [(r["policy"], r["flavour"]) for r in rows] == [(p, f) for p in ("ar", "full") for f in flavours]
    by = {(r["policy"], r["flavour"]): r for r in rows}
    assert all(by[p, "logprobs"]["same_tokens_as_plain"] for p in ("ar", "full"))
    assert by["ar", "penalties"]["rounds"] == 23 and by["ar", "penalties"]["w"] == 1
