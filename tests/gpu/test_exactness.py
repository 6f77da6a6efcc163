"""The runtime on the GPU in fp32 (TF32 off), the embedded pair's test prompts, shipped kernels:

1. Triton vs PyTorch GDN path: the logits of the same verification pass after a prefill agree
   (relative Frobenius error below 1e-4).
2. Greedy exactness: every speculative policy with the Triton backend emits exactly the tokens of
   `ar` with the PyTorch backend.
"""

from pathlib import Path

import pytest
import torch

import hybridspec
from hybridspec.artifacts.params import AcceptanceModel, PolicyParameters
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.session import open_session
from hybridspec.workbench.prompts import load_prompts

pytestmark = pytest.mark.gpu

DRAFT_LEN = 15
PROMPTS, TOKENS = 6, 32
POLICIES = ("full", "static:4", "static:9", "nominal", "hybridspec")
PROMPT_FILE = Path(hybridspec.__file__).parent / "assets" / "embedded" / "prompts.jsonl"


def hand_parameters(D: int = DRAFT_LEN) -> PolicyParameters:
    """Fixed policy parameters (no fit needed): every length allowed, a plausible cost model."""
    W = D + 1
    return PolicyParameters(
        draft_len=D, lengths=tuple(range(2, W + 1)), fixed_cost=2e-3, rho=300.0, s=1e-4, eta=1e-4,
        cost=tuple(0.0 if w < 2 else 1e-3 + 4e-4 * w + 2e-5 * w * w for w in range(W + 1)),
        nbar_all=(3.0,) * (W + 1), nbar_cond=((1.0, 3.0, 5.0, 7.0),) * (W + 1),
        acceptance=AcceptanceModel(iso_x=((0.0, 0.5, 1.0),) * D, iso_y=((0.02, 0.4, 0.98),) * D,
                                   coef=(-2.0, 6.0, -0.05, 0.0, -0.8, -0.3)))


@pytest.fixture(scope="module")
def sessions():
    """(Triton session, PyTorch session) on CUDA, fp32 with TF32 off."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return (open_session(device="cuda", dtype="float32", backend="triton"),
            open_session(device="cuda", dtype="float32", backend="torch"))


@pytest.fixture(scope="module")
def prompts(sessions) -> list[list[int]]:
    tri, _ = sessions
    test = load_prompts(PROMPT_FILE, split="test")
    return [tri.codec.encode(p.text) for p in test[:: max(1, len(test) // PROMPTS)][:PROMPTS]]


def test_triton_verification_logits_match_torch(sessions, prompts):
    worst = 0.0
    for ids in prompts[:4]:
        logits = []
        for session in sessions:
            cache = session.target.new_cache(max_len=1024, tokens_per_pass=64)
            session.target.prefill(torch.tensor([ids[:-16]], device="cuda"), cache)
            logits.append(session.target.forward_pass(torch.tensor([ids[-16:]], device="cuda"), cache).logits)
        worst = max(worst, float((logits[0] - logits[1]).norm() / logits[1].norm()))
    assert worst < 1e-4, f"triton vs torch verification logits: relative error {worst:.2e}"


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_tokens_equal_ar(sessions, prompts, policy):
    tri, ref = sessions
    speculative = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    for i, ids in enumerate(prompts):
        want = ref.engine.generate(ids, policy=make_policy("ar", DRAFT_LEN), max_new_tokens=TOKENS,
                                   eos_ids=tri.eos_ids).token_ids
        got = tri.engine.generate(ids, policy=speculative, max_new_tokens=TOKENS, eos_ids=tri.eos_ids).token_ids
        first = next((j for j, (a, b) in enumerate(zip(got + [-1], want + [-2])) if a != b), None)
        assert got == want, f"{policy}: prompt {i} differs from ar at token {first}"


@pytest.mark.parametrize("policy", ("ar", "full", "hybridspec"))
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (20, 0.95)], ids=("temperature", "top-k-top-p"))
def test_sampled_graph_rounds_equal_host_rounds(sessions, prompts, policy, top_k, top_p):
    """Temperature 1, alone or under top-k 20 and top-p 0.95, on the graph path (the point-mass
    rule's kernels and keyed draws on the device, one host read per round) emits what the
    host-driven round emits (the torch form) from the same seed."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.sampling import SamplingParams

    tri, _ = sessions
    host = Engine(tri.target, tri.drafter, max_context=tri.engine.max_context, resident=False)
    chosen = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    for i, ids in enumerate(prompts[:3]):
        sampling = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, seed=i)
        want = host.generate(ids, policy=chosen, max_new_tokens=TOKENS, sampling=sampling).token_ids
        got = tri.engine.generate(ids, policy=chosen, max_new_tokens=TOKENS, sampling=sampling).token_ids
        assert got == want, f"{policy}: prompt {i}"


@pytest.mark.parametrize("policy", ("ar", "full", "hybridspec"))
def test_graph_round_logprobs_equal_host_rounds(sessions, prompts, policy):
    """Logprobs computed inside the captured rounds (`logprobs.logprob_rows` in the graphs, their
    own host copy per round) equal the host rounds' for the same tokens, greedy and sampled."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.sampling import SamplingParams

    tri, _ = sessions
    host = Engine(tri.target, tri.drafter, max_context=tri.engine.max_context, resident=False)
    chosen = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    for sampling in (SamplingParams(), SamplingParams(temperature=0.7, seed=5), SamplingParams(0.7, 20, 0.9, 5)):
        want = host.generate(prompts[0], policy=chosen, max_new_tokens=TOKENS, sampling=sampling, logprobs=5)
        got = tri.engine.generate(prompts[0], policy=chosen, max_new_tokens=TOKENS, sampling=sampling, logprobs=5)
        assert got.token_ids == want.token_ids
        torch.testing.assert_close(torch.tensor(got.logprobs.chosen), torch.tensor(want.logprobs.chosen),
                                   atol=1e-4, rtol=0)
        values = [torch.tensor([[v for _, v in t] for t in lps.top]) for lps in (got.logprobs, want.logprobs)]
        torch.testing.assert_close(*values, atol=1e-4, rtol=0)
        assert [[i for i, _ in t] for t in got.logprobs.top] == [[i for i, _ in t] for t in want.logprobs.top]


@pytest.mark.parametrize("policy", ("ar", "full", "hybridspec"))
def test_graph_rounds_under_penalties_equal_host_rounds(sessions, prompts, policy):
    """Presence, frequency and repetition penalties, a logit bias, min_tokens and min_p inside the captured
    rounds (the request's token counts advanced on the device) give the host rounds' tokens, greedy
    and sampled."""
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.sampling import SamplingParams

    tri, _ = sessions
    host = Engine(tri.target, tri.drafter, max_context=tri.engine.max_context, resident=False)
    chosen = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    penalties = dict(presence_penalty=0.8, frequency_penalty=0.3, repetition_penalty=1.3, logit_bias=((7, 1.5),),
                     min_tokens=4)
    for sampling in (SamplingParams(**penalties), SamplingParams(temperature=1.0, seed=3, min_p=0.05, **penalties)):
        kw = dict(policy=chosen, max_new_tokens=TOKENS, sampling=sampling, eos_ids=tri.eos_ids)
        want = host.generate(prompts[1], **kw).token_ids
        got = tri.engine.generate(prompts[1], **kw).token_ids
        assert got == want, f"{policy} {sampling}"


@pytest.mark.parametrize("policy", ("ar", "full", "static:4", "hybridspec"))
def test_graph_rounds_under_a_grammar_equal_host_rounds(sessions, prompts, policy):
    """A JSON schema and a choice grammar inside the captured rounds (each row masked by the
    bitmask the host fills after reading the drafts) give the host rounds' tokens, greedy and
    sampled, and outputs the grammar allows."""
    import json

    pytest.importorskip("xgrammar")
    from hybridspec.runtime.engine import Engine
    from hybridspec.runtime.grammar import GrammarCompiler, GrammarSpec, GrammarState
    from hybridspec.runtime.sampling import SamplingParams

    tri, _ = sessions
    host = Engine(tri.target, tri.drafter, max_context=tri.engine.max_context, resident=False)
    chosen = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    compiler = GrammarCompiler(tri.codec.tokenizer, tri.target.cfg.vocab_size, tri.eos_ids)
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
              "required": ["name", "n"]}
    specs = (GrammarSpec("json_schema", json.dumps(schema)), GrammarSpec.choice(["alpha", "beta", "gamma"]))
    for spec in specs:
        for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
            kw = dict(policy=chosen, max_new_tokens=40, sampling=sampling, eos_ids=tri.eos_ids)
            runs = [engine.generate(prompts[2], grammar=GrammarState(compiler.compile(spec), tri.eos_ids,
                                                                     tri.target.cfg.vocab_size), **kw).token_ids
                    for engine in (host, tri.engine)]
            assert runs[1] == runs[0], f"{policy} {spec.kind} {sampling}"
            if runs[0][-1] in tri.eos_ids and spec.kind == "choice":
                assert tri.codec.decode(runs[0][:-1]) in ("alpha", "beta", "gamma")


@pytest.mark.parametrize("policy", ("ar", "full"))
def test_a_stop_within_a_graph_round_leaves_the_next_request_whole(sessions, prompts, policy):
    """`Engine.generate`'s stop on the graph path, whose rounds are launched ahead of the last
    report: the output is the whole output's first ids, and a request after the stream closed with
    a round in flight decodes what it decodes alone."""
    tri, _ = sessions
    chosen = make_policy(policy, DRAFT_LEN, hand_parameters(), device="cuda")
    kw = dict(policy=chosen, max_new_tokens=TOKENS, eos_ids=())
    whole, alone = (tri.engine.generate(ids, **kw).token_ids for ids in prompts[:2])
    for length in (1, 5, 17):
        cut = tri.engine.generate(prompts[0], stop=lambda ids, seen, n=length: n if len(ids) >= n else None, **kw)
        assert cut.token_ids == whole[:length] and cut.finish_reason == "stop", length
        assert tri.engine.generate(prompts[1], **kw).token_ids == alone, length
