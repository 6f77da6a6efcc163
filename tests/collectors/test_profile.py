"""The cost-profile pass (`capture --passes profile`) on a random-weight preset, and its profiler
attribution: every part's rows present, the operators of a range counted in that range's part,
the distinct (layer, expert) pairs within what the routing allows, the model's methods restored."""

from __future__ import annotations

import json

import pytest
import torch

from hybridspec.collectors.campaign import run_campaign
from hybridspec.collectors.common import CaptureConfig, parse_passes
from hybridspec.collectors.profile import PARTS, QUICK_CALLS, QUICK_WIDTHS, distinct_pairs, module_ranges
from hybridspec.runtime.presets import preset_config
from hybridspec.runtime.session import open_session
from hybridspec.workbench.profiling import part_times, profile_calls, ranged
from hybridspec.workbench.store import Store, run_id_for

MODEL = "random-tiny"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    vocab = preset_config(MODEL)["vocab_size"]
    gen = torch.Generator().manual_seed(2)
    rows = [{"id": f"p{i}", "category": "ab"[i % 2], "split": "calib",
             "prompt_ids": torch.randint(0, vocab, (12,), generator=gen).tolist()} for i in range(2)]
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    db = root / "store.duckdb"
    run_campaign(CaptureConfig(model=MODEL, prompts=prompts, db=db, name="p", passes=("profile",), quick=True))
    with Store(db, read_only=True) as s:
        run = run_id_for("p", "profile")
        yield (s.frame("SELECT * FROM cost_profile WHERE run_id = ? ORDER BY w, part", [run]),
               s.frame("SELECT * FROM profile_calls WHERE run_id = ? ORDER BY call_idx", [run]))


def test_every_width_has_every_part_and_the_drafter_a_row(store):
    rows, _ = store
    target = rows.filter(rows["part"] != "drafter")
    assert sorted(set(target["w"])) == list(QUICK_WIDTHS)
    for w in QUICK_WIDTHS:
        parts = target.filter(target["w"] == w)
        assert sorted(parts["part"]) == sorted(PARTS)
        assert parts["latency_us"].n_unique() == 1 and parts["latency_us"][0] > 0
        assert (parts["kernel_us"] >= 0).all() and parts["kernel_us"].sum() > 0
    # each mixer and MoE block launched operators inside its range
    assert (target.filter(target["part"].is_in(["gdn", "attention", "moe"]))["kernels"] > 0).all()
    drafter = rows.filter(rows["part"] == "drafter")
    assert len(drafter) == 1 and drafter["kernel_us"][0] > 0
    assert set(rows["attribution"]) == {"launching op"}  # a CPU run: operators' own time


def test_calls_cycle_the_widths_within_the_routing_bounds(store):
    _, calls = store
    cfg = preset_config(MODEL)
    moe_layers, k, experts = cfg["num_hidden_layers"], cfg["num_experts_per_tok"], cfg["num_experts"]
    assert calls["call_idx"].to_list() == list(range(QUICK_CALLS))
    assert calls["w"].to_list() == [QUICK_WIDTHS[i % len(QUICK_WIDTHS)] for i in range(QUICK_CALLS)]
    for w, pairs in zip(calls["w"], calls["distinct_pairs"]):
        assert moe_layers * k <= pairs <= moe_layers * min(experts, w * k)
    assert (calls["latency_us"] > 0).all()


def test_distinct_pairs_counts_each_layer_apart():
    layer_a = torch.tensor([[[0, 1], [1, 2]]])  # 3 distinct
    layer_b = torch.tensor([[[3, 4], [4, 3]]])  # 2 distinct; expert 3 again in another layer counts
    assert distinct_pairs([layer_a, layer_b]) == 5


def test_an_operator_counts_in_its_innermost_range():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    inner = ranged(lambda: torch.mm(a, b), "moe")
    outer = ranged(lambda: (torch.mm(a, b), inner()), "gdn")

    def call():
        outer()
        torch.add(a, b)  # outside every range

    prof = profile_calls(call, reps=3, device=torch.device("cpu"))
    times, counts, how = part_times(prof, ("gdn", "moe", "other"), 3)
    assert how == "launching op"
    assert counts["gdn"] == counts["moe"] == pytest.approx(1.0)  # the mm directly inside each range
    assert counts["other"] == pytest.approx(1.0)  # the add
    assert all(t > 0 for t in times.values())


def test_module_ranges_change_nothing_and_are_undone():
    session = open_session(MODEL, "random")
    target = session.target
    cache = target.new_cache(max_len=32, tokens_per_pass=16)
    tokens = torch.randint(0, target.cfg.vocab_size, (1, 5), generator=torch.Generator().manual_seed(0))
    plain = target.forward_pass(tokens, cache).logits
    cache = target.new_cache(max_len=32, tokens_per_pass=16)
    with module_ranges(target):
        ranged_logits = target.forward_pass(tokens, cache).logits
    assert torch.equal(plain, ranged_logits)
    for layer in target.layers:
        mixer = layer.linear_attn if layer.is_gdn else layer.self_attn
        assert "forward" not in vars(mixer) and "route" not in vars(layer.mlp) and "run_experts" not in vars(layer.mlp)


def test_profile_is_asked_for_by_name():
    assert "profile" not in parse_passes("all")
    assert parse_passes("all,profile")[-1] == "profile" and parse_passes("profile") == ("profile",)
