"""On CUDA the Stage-0 and MoE passes time the replays of CUDA graphs of their calls, as the
resident round runs them (an eager call's events would time its Python launches), and say so in
their run parameters; a replayed Stage 0 computes what the eager call computes."""

import json

import pytest
import torch
from typer.testing import CliRunner

from hybridspec.cli import app
from hybridspec.runtime.session import open_session
from hybridspec.workbench.profiling import replayable
from hybridspec.workbench.store import Store

pytestmark = pytest.mark.gpu


def test_stage0_and_moe_passes_time_graph_replays(tmp_path):
    db = tmp_path / "g.duckdb"
    result = CliRunner().invoke(app, ["capture", "--db", str(db), "--name", "g", "--device", "cuda", "--passes",
                                      "stage0,moe", "--quick"])
    assert result.exit_code == 0, result.output
    with Store(db, read_only=True) as store:
        params = {name: json.loads(p) for name, p in store.query("SELECT pass, params FROM runs")}
        stage0 = store.query("SELECT u, count(*), min(latency_us) FROM stage0_timings GROUP BY u ORDER BY u")
        moe = store.query("SELECT n_distinct_experts, count(*), min(latency_us) FROM moe_bench GROUP BY 1 ORDER BY 1")
    assert params["stage0"]["timing"] == params["moe"]["timing"] == "cuda graph replays"
    assert [u for u, _, _ in stage0] == params["stage0"]["lengths"]
    assert [n for n, _, _ in moe] == params["moe"]["distinct"]
    for _, count, fastest in stage0 + moe:
        assert count == params["stage0"]["samples"] and fastest > 0


@pytest.mark.parametrize("u", [1, 5, 16])
def test_a_replayed_stage0_equals_the_eager_call(u):
    target = open_session(None, None, device="cuda", dtype="float32", backend="triton").target
    cache = target.new_cache(max_len=128, tokens_per_pass=64)
    gen = torch.Generator().manual_seed(u)
    target.prefill(torch.randint(0, target.cfg.vocab_size, (1, 40), generator=gen).cuda(), cache)
    target.enter_static(cache, 16)
    tokens = torch.randint(0, target.cfg.vocab_size, (1, u), generator=gen).cuda()
    out = {}

    def call():
        cache.pending[0] = True
        out["s0"] = target.stage0(tokens, cache)

    call()
    eager = {k: v.clone() for k, v in vars(out["s0"]).items() if isinstance(v, torch.Tensor)}
    replay = replayable(call, torch.device("cuda"))
    for name in eager:  # the captured call's outputs live in the graph's buffers: clear them, replay
        getattr(out["s0"], name).zero_()
    cache.pending[0] = True
    replay()
    for name, value in eager.items():
        assert torch.equal(getattr(out["s0"], name), value), name


def test_a_replay_keeps_the_inputs_its_callable_owns():
    """Graphs of callables that own their inputs (as the MoE pass's do, one routing per n) each
    replay their own inputs, even after the callables are dropped and same-sized tensors allocated."""
    def owning(seed):
        x = torch.randn(64, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
        out = torch.empty(64, device="cuda")
        return (lambda: out.copy_(x.sum(1))), out, x.sum(1)

    replays = []
    for seed in range(4):
        fn, out, want = owning(seed)
        replays.append((replayable(fn, torch.device("cuda")), out, want))
        del fn
    for replay, out, want in replays:
        out.zero_()
        replay()
        assert torch.equal(out, want)
