"""Tensor parallelism on CPU with gloo, world size 2 (spawned processes): each rank loads only its
part of the target (half the heads and intermediate columns, or with expert parallelism half the
experts whole); its logits equal one process's within fp32 rounding (the all-reduce sums the halves
in another order), and greedy decoding through the engine (the embedded drafter, `ar` and
`hybridspec`; `hybridspec` alone under expert parallelism) emits one process's tokens on every
rank. The split itself: counts not divisible by the world size are named; every slice is where the
docstring puts it; a rank's part loaded from a checkpoint or drawn for a preset equals the slices
of the whole target."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import torch.distributed as dist

from hybridspec.runtime.config import ConfigError
from hybridspec.runtime.loading import load_target
from hybridspec.runtime.sharding import local_config, shard_state
from hybridspec.runtime.tensor_parallel import parallelize, spawn

WORLD = 2
POLICIES = ("ar", "hybridspec")  # one process's rounds (w per round) as well as its tokens


def _check_rank(expert_parallel: bool) -> None:
    """One rank's checks, in the process group `tensor_parallel.spawn` made for it."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.policies import make_policy
    from hybridspec.runtime.session import EMBEDDED, open_session
    from tests.runtime.helpers import policy_parameters, prefilled_cache

    rank, world = dist.get_rank(), dist.get_world_size()
    session = open_session(device="cpu", dtype="float32", backend="torch")
    full, drafter = session.target, session.drafter
    local = parallelize(load_target(EMBEDDED / "target", dtype="float32", feature_layers=full.feature_layers,
                                    shard=(rank, world), expert_parallel=expert_parallel))
    assert local.cfg.linear_num_value_heads * world == full.cfg.linear_num_value_heads
    moe = local.layers[0].mlp
    held = moe.experts.gate_up_proj.shape[0]
    assert (held * world, moe.first_expert) == ((full.cfg.num_experts, rank * held) if expert_parallel
                                                else (world * full.cfg.num_experts, 0))
    prompt = session.codec.encode("The tensor-parallel target splits every layer's heads across the ranks.")
    block = torch.tensor([prompt[-6:]])
    logits = []
    for target in (full, local):
        cache = prefilled_cache(target, prompt[:-6], 16)
        logits.append(target.forward_pass(block, cache).logits)
    assert local.new_cache(max_len=64).ssm.shape[2] * world == full.new_cache(max_len=64).ssm.shape[2]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    gathered = [torch.empty_like(logits[1]) for _ in range(world)]
    dist.all_gather(gathered, logits[1])
    assert all(torch.equal(g, gathered[0]) for g in gathered)  # every rank holds the same logits
    params = policy_parameters(drafter.draft_len)
    for name in POLICIES[1:] if expert_parallel else POLICIES:
        policy = make_policy(name, drafter.draft_len, params)
        want = Engine(full, drafter, max_context=256).generate(prompt, policy=policy, max_new_tokens=24)
        got = Engine(local, drafter, max_context=256).generate(prompt, policy=policy, max_new_tokens=24)
        assert got.token_ids == want.token_ids, (rank, name)
        assert [r.w for r in got.rounds] == [r.w for r in want.rounds], (rank, name)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["columns", "experts"])
def test_two_ranks_with_gloo_equal_one_process(expert_parallel):
    spawn(_check_rank, WORLD, "cpu", expert_parallel)  # the launcher the commands use; a rank's failure raises


@pytest.fixture(scope="module")
def embedded_target():
    from hybridspec.runtime.session import open_session

    return open_session(device="cpu", dtype="float32", backend="torch").target


def test_local_config_divides_the_split_counts_and_names_what_does_not_divide(embedded_target):
    cfg = embedded_target.cfg
    half = local_config(cfg, 2)
    assert (half.num_attention_heads, half.linear_num_value_heads, half.moe_intermediate_size) == (
        cfg.num_attention_heads // 2, cfg.linear_num_value_heads // 2, cfg.moe_intermediate_size // 2)
    assert half.hidden_size == cfg.hidden_size and half.num_experts == cfg.num_experts
    with pytest.raises(ConfigError, match="num_key_value_heads = 2 .attention KV heads. is not a multiple of 4"):
        local_config(cfg, 4)
    experts = local_config(cfg, 2, expert_parallel=True)
    assert (experts.moe_intermediate_size, experts.local_experts, experts.num_experts, experts.expert_shards) == (
        cfg.moe_intermediate_size, cfg.num_experts // 2, cfg.num_experts, 2)
    assert experts.shared_expert_intermediate_size == cfg.shared_expert_intermediate_size // 2
    with pytest.raises(ConfigError, match=f"expert parallelism over 3 ranks: num_experts = {cfg.num_experts} is not a "
                                          "multiple of 3"):
        local_config(cfg, 3, expert_parallel=True)


def test_shard_state_slices(embedded_target):
    """The slices by hand on the embedded target: GDN q/k/v rows of the rank's key and value heads,
    A_log, out_proj's columns, gate and up rows of the rank's intermediate columns, o_proj's
    columns; the router and the LM head whole."""
    cfg, state = embedded_target.cfg, embedded_target.state_dict()
    gdn = f"layers.{cfg.gdn_layers[0]}."
    attn = f"layers.{cfg.attention_layers[0]}."
    dk, dv, hk, hv = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    i, d = cfg.moe_intermediate_size, cfg.head_dim
    for rank in range(2):
        part = shard_state(state, cfg, rank, 2)
        qkv = state[gdn + "linear_attn.in_proj_qkv.weight"]
        q, k, v = qkv.split((hk * dk, hk * dk, hv * dv))
        sl = lambda t, n: t[rank * n // 2 : (rank + 1) * n // 2]  # noqa: E731
        assert torch.equal(part[gdn + "linear_attn.in_proj_qkv.weight"],
                           torch.cat((sl(q, hk * dk), sl(k, hk * dk), sl(v, hv * dv))))
        assert torch.equal(part[gdn + "linear_attn.A_log"], sl(state[gdn + "linear_attn.A_log"], hv))
        assert torch.equal(part[gdn + "linear_attn.out_proj.weight"],
                           sl(state[gdn + "linear_attn.out_proj.weight"].T, hv * dv).T)
        gu = state[gdn + "mlp.experts.gate_up_proj"]
        assert torch.equal(part[gdn + "mlp.experts.gate_up_proj"],
                           torch.cat((sl(gu[:, :i].transpose(0, 1), i), sl(gu[:, i:].transpose(0, 1), i))).transpose(0, 1))
        assert torch.equal(part[attn + "self_attn.o_proj.weight"],
                           sl(state[attn + "self_attn.o_proj.weight"].T, cfg.num_attention_heads * d).T)
        assert torch.equal(part[gdn + "mlp.gate.weight"], state[gdn + "mlp.gate.weight"])  # the router whole
        assert torch.equal(part["lm_head.weight"], state["lm_head.weight"])
        experts = shard_state(state, cfg, rank, 2, expert_parallel=True)  # half the experts whole
        for name in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
            assert torch.equal(experts[gdn + name], sl(state[gdn + name], cfg.num_experts))
        for name in state:
            if ".mlp.experts." not in name:
                assert torch.equal(experts[name], part[name]), name


@pytest.mark.parametrize("model", ["random-tiny", "qwen35_dir", "qwen3next_dir"])
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["columns", "experts"])
def test_a_ranks_loaded_part_equals_the_slices_of_the_whole_target(model, expert_parallel, request):
    """`load_target(shard=…)` reads a checkpoint (fused 3-D experts; per-expert tensors and fused
    qkvz/ba projections) or draws a preset's weights one full parameter at a time, and keeps only
    the rank's slices: the same tensors as `shard_state` of the whole target; with expert
    parallelism each MoE block knows the first expert it holds."""
    spec = request.getfixturevalue(model) if model.endswith("_dir") else model
    whole = load_target(spec, dtype="float32")
    for rank in range(2):
        part = load_target(spec, dtype="float32", shard=(rank, 2), expert_parallel=expert_parallel)
        assert part.cfg == local_config(whole.cfg, 2, expert_parallel=expert_parallel)
        want = shard_state(whole.state_dict(), whole.cfg, rank, 2, expert_parallel=expert_parallel)
        got = part.state_dict()
        assert set(got) == set(want)
        for name in want:
            assert torch.equal(got[name], want[name]), (model, rank, name)
        firsts = {layer.mlp.first_expert for layer in part.layers if layer.is_moe}
        assert firsts == {rank * whole.cfg.num_experts // 2 if expert_parallel else 0}


def test_generate_under_torchrun_emits_the_tokens_of_one_process():
    """`torchrun --nproc-per-node 2 -m hybridspec generate --tp 2`: each process is one rank (env://
    rendezvous, gloo), rank 0 alone prints its summary: one process's tokens, rounds and logprobs,
    under a presence penalty (every rank keeps the same token counts) and a grammar (every rank
    compiles it and masks its rows alike)."""
    import json
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from hybridspec.runtime.generation import GenerateRequest, run_generate
    from hybridspec.runtime.grammar import GrammarSpec

    pattern = "[a-z_]{2,12} = [0-9]{1,3}"
    request = GenerateRequest(prompt="Split the heads over two ranks.", policy="static:4", max_new_tokens=16,
                              presence_penalty=0.5, logprobs=2, grammar=GrammarSpec("regex", pattern))
    one = run_generate(request)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    run = subprocess.run([torchrun, "--nproc-per-node", "2", "-m", "hybridspec", "generate", "--tp", "2", "--prompt",
                          request.prompt, "--policy", "static:4", "--max-new-tokens", "16", "--json",
                          "--presence-penalty", "0.5", "--logprobs", "2", "--regex", pattern],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stdout + run.stderr
    (line,) = [x for x in run.stdout.splitlines() if x.startswith("{")]  # one summary: rank 0's
    two = json.loads(line)
    assert two["token_ids"] == one["token_ids"] and two["rounds"] == one["rounds"]
    assert re.fullmatch(pattern, one["text"].replace("<|endoftext|>", "")), one["text"]
    assert [e["logprob"] for e in two["logprobs"]] == pytest.approx([e["logprob"] for e in one["logprobs"]], abs=1e-4)
    with pytest.raises(ValueError, match="give exactly one of a prompt text or prompt ids"):
        run_generate(dataclasses.replace(request, prompt=None, tp=2))


class _UnlistedBadInput(ValueError):
    """A ValueError subclass that no list of names knows."""


def _fail_on_rank_one(index: int) -> None:
    if index == 1:
        raise _UnlistedBadInput("rank one's input is bad")


def _fail_with_a_bug(index: int) -> None:
    raise RuntimeError("a bug")


def test_a_ranks_bad_input_is_reported_as_such():
    from hybridspec.runtime.tensor_parallel import run_processes

    with pytest.raises(ValueError, match="^rank one's input is bad$"):
        run_processes(_fail_on_rank_one, 2, ())
    with pytest.raises(Exception) as caught:  # any other error stays what it was, not bad input
        run_processes(_fail_with_a_bug, 2, ())
    assert not isinstance(caught.value, ValueError) and "a bug" in str(caught.value)


def test_a_world_size_that_does_not_divide_is_refused_before_any_rank_starts(monkeypatch):
    from hybridspec.runtime import tensor_parallel
    from hybridspec.runtime.generation import GenerateRequest, run_generate

    monkeypatch.setattr(tensor_parallel, "spawn", lambda *a, **k: pytest.fail("a rank was spawned"))
    with pytest.raises(ConfigError, match="over 3 ranks: num_attention_heads = 4 .attention heads. is not a multiple"):
        run_generate(GenerateRequest(prompt="x", tp=3))


def test_expert_parallelism_without_ranks_to_split_over_is_refused():
    from hybridspec.runtime.generation import GenerateRequest, run_generate

    with pytest.raises(ConfigError, match="expert parallelism .* needs --tp 2 or more .got --tp 1."):
        run_generate(GenerateRequest(prompt="x", expert_parallel=True))
