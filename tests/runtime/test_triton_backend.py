"""The runtime on the Triton kernels (under TRITON_INTERPRET=1 on CPU tensors): the gated GDN
verification kernels, writing z / |k|, g_cum and the raw k into the round buffers (`raw_keys`) and
folding each round's commit into the next verification, the split-KV attention, the router and
the expert kernels, decode exactly the `ar` tokens of the
PyTorch backend."""

from __future__ import annotations

import pytest
import torch

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.loading import load_target
from hybridspec.runtime.policies import make_policy
from tests.checkpoints import write_tiny_qwen3_5_moe
from tests.runtime.helpers import ScriptedDrafter, policy_parameters

pytest.importorskip("triton")
NEW_TOKENS = 14


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 20)]  # 20: prefill > 16


@pytest.fixture(scope="module")
def alternating_dir(tmp_path_factory):
    """Layers GDN, attention, GDN, attention, with the widths of `qwen35_dir`: two of each kind, so
    that, as in the 8 layers of `qwen35_dir`, each cache is read and written at a slot other than 0
    and GDN layers run both in Stage 0 and in Stage 1, with about half its kernel launches (which
    the interpreter runs program by program)."""
    return write_tiny_qwen3_5_moe(tmp_path_factory.mktemp("alternating"), num_hidden_layers=4,
                                  full_attention_interval=2)


@pytest.fixture(scope="module")
def torch_ar_tokens(alternating_dir) -> list[tuple[list[int], list[int]]]:
    """(prompt, the PyTorch backend's `ar` tokens) per prompt."""
    reference = load_target(alternating_dir, feature_layers=ScriptedDrafter.feature_layers)
    ar, pairs = make_policy("ar", 15), []
    for prompt in _prompts(reference.cfg.vocab_size):
        result = Engine(reference, max_context=128).generate(prompt, policy=ar, max_new_tokens=NEW_TOKENS)
        pairs.append((prompt, result.token_ids))
    return pairs


@pytest.fixture(scope="module")
def triton_target(alternating_dir):
    return load_target(alternating_dir, backend="triton", feature_layers=ScriptedDrafter.feature_layers)


def test_triton_backend_emits_exactly_the_torch_ar_tokens(triton_target, torch_ar_tokens):
    """`full` (every round at w = 16) on the short prompt, `hybridspec` (two-stage verification with
    the routing correction) on the one whose prefill runs past 16 tokens."""
    vocab = triton_target.cfg.vocab_size
    accepted = set()
    for i, ((prompt, want), policy_name) in enumerate(zip(torch_ar_tokens, ("full", "hybridspec"), strict=True)):
        drafter = ScriptedDrafter(prompt + want, vocab, seed=i)
        engine = Engine(triton_target, drafter, max_context=128)
        result = engine.generate(prompt, policy=make_policy(policy_name, 15, policy_parameters()),
                                 max_new_tokens=NEW_TOKENS)
        assert result.token_ids == want, policy_name
        accepted.update(r.accepted for r in result.rounds)
    assert len(accepted) >= 3, f"acceptance counts seen: {sorted(accepted)}"  # commits of several m


def test_ablation_backend_runs_the_gdn_reference_in_the_resident_round(alternating_dir):
    """`triton-torch-gdn` (the paper's Table 3 ablation): the GDN layers take the PyTorch reference
    (verification, fold, conv), everything else the Triton kernels; its passes read nothing back,
    so the resident round runs it, and HybridSpec's rounds (random DFlash drafter) emit the torch
    backend's `ar` tokens."""
    from hybridspec.kernels.gdn import reference as gdn_reference
    from hybridspec.kernels.moe import triton as moe_triton
    from hybridspec.runtime.backends import gdn_conv_op, gdn_ops, moe_experts_op, triton_kernels

    assert gdn_ops("triton-torch-gdn") == (gdn_reference.gdn_verify_gated, gdn_reference.gdn_commit)
    assert gdn_conv_op("triton-torch-gdn") is gdn_reference.causal_conv_silu
    assert moe_experts_op("triton-torch-gdn") is moe_triton.moe_experts
    assert triton_kernels("triton-torch-gdn", "norm.triton") is not None
    from hybridspec.runtime.session import open_session

    reference = load_target(alternating_dir)
    prompt = _prompts(reference.cfg.vocab_size)[0]
    want = Engine(reference, max_context=128).generate(prompt, policy=make_policy("ar", 15), max_new_tokens=4).token_ids
    # a DFlash drafter with random weights
    ablation = open_session(str(alternating_dir), "random", backend="triton-torch-gdn")
    engine = Engine(ablation.target, ablation.drafter, max_context=128, resident=True, graphs=False)
    D = ablation.drafter.draft_len
    result = engine.generate(prompt, policy=make_policy("hybridspec", D, policy_parameters(D)), max_new_tokens=4)
    assert result.token_ids == want


def test_one_token_passes_on_the_register_slice_kernels_emit_the_torch_ar_tokens(triton_target, torch_ar_tokens,
                                                                                 monkeypatch):
    """`ar` (every pass one token): the mixers' projections, the LM head, the router and the experts
    take their register-slice forms (`kernels/linear`, `router_rows.py`, `gate_up_rows.py` /
    `down_rows.py`), the post-attention norm runs inside the router's launch, and the tokens are the
    PyTorch backend's."""
    from hybridspec.kernels.linear import triton as linear_triton
    from hybridspec.kernels.moe import gate_up_rows, router_rows

    taken = {"linear": 0, "the LM head": 0, "router": 0, "router with the norm inside": 0, "experts": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            taken[name] += 1
            if name == "router" and args[-1] is not None:  # launch_router_rows's norm
                taken["router with the norm inside"] += 1
            if name == "linear" and args[1] is triton_target.lm_head.weight:
                taken["the LM head"] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(linear_triton, "rows_linear", counted("linear", linear_triton.rows_linear))
    monkeypatch.setattr("hybridspec.kernels.moe.router.launch_router_rows",
                        counted("router", router_rows.launch_router_rows))
    monkeypatch.setattr("hybridspec.kernels.moe.triton.launch_gate_up_rows",
                        counted("experts", gate_up_rows.launch_gate_up_rows))
    prompt, want = torch_ar_tokens[0]
    result = Engine(triton_target, max_context=128).generate(prompt, policy=make_policy("ar", 15),
                                                             max_new_tokens=NEW_TOKENS)
    assert result.token_ids == want
    assert all(taken.values()), taken


def test_gdn_ops_launches_the_given_tuning_and_the_reference_past_sixteen_tokens(monkeypatch):
    """`gdn_ops(backend, tuning)`: calls of up to 16 tokens reach the Triton kernel with that table
    (the shipped one when None), longer ones the reference."""
    from hybridspec.kernels.gdn import reference as gdn_reference
    from hybridspec.kernels.gdn import triton as gdn_triton
    from hybridspec.kernels.gdn.tuning import SHIPPED, VerifyTuning
    from hybridspec.runtime.backends import gdn_ops

    seen = []
    monkeypatch.setattr(gdn_triton, "gdn_verify_gated", lambda *a, **kw: seen.append(("triton", kw.get("tuning"))))
    monkeypatch.setattr(gdn_reference, "gdn_verify_gated", lambda *a, **kw: seen.append(("reference", None)))
    table = SHIPPED.replace(verify={1: VerifyTuning("recurrent", 2, 1)})
    args = (None,) * 8 + (1.0,)
    for tuning in (None, table):
        verify = gdn_ops("triton", tuning)[0]
        verify(torch.zeros(1, 1, 2, 4), *args[1:])
        verify(torch.zeros(1, 17, 2, 4), *args[1:])
    assert seen == [("triton", None), ("reference", None), ("triton", table), ("reference", None)]


def test_penalties_and_logprobs_on_the_kernels_equal_the_torch_forms(alternating_dir, triton_target, monkeypatch):
    """Penalties (repetition, frequency, presence, bias, min_tokens) and logprobs through
    `kernels/penalties` and `kernels/logprobs` (the triton backend's, counted) give the PyTorch
    backend's tokens and log-probabilities, under `ar` and under `full` whose rows follow their own
    drafts."""
    from hybridspec.kernels.logprobs import triton as logprobs_triton
    from hybridspec.kernels.penalties import triton as penalties_triton
    from hybridspec.runtime.sampling import SamplingParams

    launches = {"logprobs": 0, "penalties": 0}

    def counted(module, name, key):
        op = getattr(module, name)

        def run(*args, **kwargs):
            launches[key] += 1
            return op(*args, **kwargs)

        monkeypatch.setattr(module, name, run)

    counted(logprobs_triton, "logprob_rows", "logprobs")
    counted(penalties_triton, "penalized_logits", "penalties")

    reference = load_target(alternating_dir, feature_layers=ScriptedDrafter.feature_layers)
    sampling = SamplingParams(presence_penalty=0.8, frequency_penalty=0.3, repetition_penalty=1.3,
                              logit_bias=((7, 1.5),), min_tokens=6)
    prompt = _prompts(reference.cfg.vocab_size)[0]
    want = Engine(reference, max_context=128).generate(prompt, policy=make_policy("ar", 15), max_new_tokens=NEW_TOKENS,
                                                       sampling=sampling, logprobs=4, eos_ids=(3,))
    assert len(set(want.token_ids)) > 1 and launches == {"logprobs": 0, "penalties": 0}  # the torch backend's forms
    for policy_name in ("ar", "full"):
        drafter = ScriptedDrafter(prompt + want.token_ids, reference.cfg.vocab_size, seed=1)
        got = Engine(triton_target, drafter, max_context=128).generate(
            prompt, policy=make_policy(policy_name, 15, policy_parameters()), max_new_tokens=NEW_TOKENS,
            sampling=sampling, logprobs=4, eos_ids=(3,))
        assert got.token_ids == want.token_ids, policy_name
        torch.testing.assert_close(torch.tensor(got.logprobs.chosen), torch.tensor(want.logprobs.chosen),
                                   atol=1e-4, rtol=0)
        assert [[i for i, _ in t] for t in got.logprobs.top] == [[i for i, _ in t] for t in want.logprobs.top]
        assert launches["logprobs"] >= len(got.rounds) and launches["penalties"] >= len(got.rounds)
