"""The GPU-resident round (runtime/resident.py) run eagerly on CPU, against the host-driven round:

- every policy emits exactly the host path's `ar` tokens (EOS mid-round and output limits too);
- the device forms of Eq. 5, Eq. 6 and greedy acceptance equal their host forms on random inputs;
- positions: the device copies equal the host's after every request.
CUDA-graph capture itself runs in tests/gpu."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.sampling import KERNEL_TOP_K
from hybridspec.runtime.engine import Engine
from hybridspec.runtime.policies import make_policy
from hybridspec.kernels.finish.reference import greedy_accepted
from hybridspec.runtime.resident import sampling_mode
from hybridspec.runtime.sampling import SamplingParams
from hybridspec.runtime.sampling import verify_greedy
from hybridspec.runtime.session import open_session
from tests.runtime.helpers import RecordedGraphs, policy_parameters

POLICIES = ("full", "static:4", "nominal", "hybridspec", "ratio4")
PROMPTS = ("def fibonacci(n):\n    ", "import os\nimport sys\n\n", "class Config:\n    def __init__(self", "    return ")
TOKENS = 40


@pytest.fixture(scope="module")
def session():
    return open_session()  # the embedded pair: a drafter that is accepted often


@pytest.fixture(scope="module")
def engines(session):
    return (Engine(session.target, session.drafter, max_context=256, resident=False),
            Engine(session.target, session.drafter, max_context=256, resident=True, graphs=False))


@pytest.fixture(scope="module")
def reference(session, engines):
    host, _ = engines
    ar = make_policy("ar", session.drafter.draft_len)
    prompts = [session.codec.encode(p) for p in PROMPTS]
    return prompts, [host.generate(p, policy=ar, max_new_tokens=TOKENS).token_ids for p in prompts]


@pytest.mark.parametrize("name", ("ar", *POLICIES))
def test_resident_rounds_emit_the_ar_tokens(session, engines, reference, name):
    _, resident = engines
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompts, outs = reference
    accepted = set()
    for prompt, want in zip(prompts, outs):
        got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS)
        assert got.token_ids == want
        accepted.update(r.accepted for r in got.rounds)
        # the device positions followed every commit
        cache = resident.cache
        assert int(cache.position[0]) == cache.length
        if policy.speculative:
            assert int(resident.drafter.position[0]) == resident.drafter.length == cache.length
    if name == "full":
        assert max(accepted) >= 3  # rounds with several accepted drafts happened


@pytest.mark.parametrize("name", ("full", "static:4", "hybridspec"))
def test_resident_rounds_report_the_host_rounds(session, engines, reference, name):
    """What the capture pass stores of a round comes out of the resident report as from the host
    round: lengths, acceptance, drafts and Layer 0's experts of the Stage-0 tokens (u rows; under
    the routing correction the resident Stage 0 runs the whole block, u = W, where the host's stops
    at the token after w0: its rows are the first of the resident's)."""
    host, resident = engines
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompts, _ = reference
    for prompt in prompts[:1]:
        want = host.generate(prompt, policy=policy, max_new_tokens=TOKENS).rounds
        got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS).rounds
        assert len(got) == len(want)
        for g, h in zip(got, want):
            assert (g.w0, g.w, g.accepted, g.draft_tokens) == (h.w0, h.w, h.accepted, h.draft_tokens)
            assert g.u == (policy.max_length if policy.corrects_routing else h.u)
            assert g.layer0_experts.shape == (g.u, session.target.cfg.num_experts_per_tok)
            assert torch.equal(g.layer0_experts[: h.u], h.layer0_experts)


def test_graphs_of_several_policies_stay_apart(session, reference):
    """Policies prepared one after another on one engine (as `eval` and the server do) each replay
    their own phases: `ratio4`, `nominal` and `hybridspec` share phase names (`select`, …) but not
    what the phases do. Same tokens as `ar`, same lengths as an engine that ran the policy alone."""
    t, d = session.target, session.drafter
    shared = Engine(t, d, max_context=256, resident=True, graphs=False)
    shared.resident.graphs = RecordedGraphs(shared.resident)
    names = ("ratio4", "nominal", "hybridspec")
    policies = [make_policy(n, d.draft_len, policy_parameters(d.draft_len)) for n in names]
    prompts, outs = reference
    for prompt, want in zip(prompts[:2], outs[:2]):  # the second request runs after every policy's capture
        for policy in policies:
            alone = Engine(t, d, max_context=256, resident=True, graphs=False).generate(prompt, policy=policy,
                                                                                       max_new_tokens=TOKENS)
            got = shared.generate(prompt, policy=policy, max_new_tokens=TOKENS)
            assert got.token_ids == want, policy.name
            assert [(r.w0, r.w) for r in got.rounds] == [(r.w0, r.w) for r in alone.rounds], policy.name
    graphs = shared.resident.graphs
    assert graphs.captures == len(graphs.graphs)  # every phase captured once, none replaced by another policy's


@pytest.mark.parametrize("name", ("static:4", "hybridspec"))
def test_a_prepared_policys_graphs_are_the_ones_its_requests_replay(session, reference, name):
    """`Engine.prepare` (a server's start-up) captures what the policy's requests then replay: no
    request captures again, for policies whose device copy is a new object as for those that are
    their own."""
    t, d = session.target, session.drafter
    engine = Engine(t, d, max_context=256, resident=True, graphs=False)
    engine.resident.graphs = RecordedGraphs(engine.resident)
    policy = make_policy(name, d.draft_len, policy_parameters(d.draft_len))
    engine.prepare(policy)
    prepared = engine.resident.graphs.captures
    prompts, outs = reference
    assert engine.generate(prompts[0], policy=policy, max_new_tokens=TOKENS).token_ids == outs[0]
    assert prepared > 0 and engine.resident.graphs.captures == prepared


def test_graphs_are_captured_again_when_a_larger_cache_moves_the_tables_they_read(session, reference):
    """A larger cache made elsewhere (a profile pass) reallocates the target's RoPE tables and the
    drafter's context cache; the next request captures its graphs again instead of replaying ones
    that read the freed tensors."""
    t, d = session.target, session.drafter
    engine = Engine(t, d, max_context=256, resident=True, graphs=False)
    engine.resident.graphs = RecordedGraphs(engine.resident)
    policy = make_policy("static:4", d.draft_len)
    prompts, outs = reference
    engine.generate(prompts[0], policy=policy, max_new_tokens=TOKENS)
    first = engine.resident.graphs.captures
    t.new_cache(max_len=4096)
    d.reset(4096)
    assert engine.generate(prompts[1], policy=policy, max_new_tokens=TOKENS).token_ids == outs[1]
    assert engine.resident.graphs.captures == 2 * first


def test_a_policy_for_another_draft_length_is_refused(session, engines):
    d = session.drafter
    for name in ("full", "static:4", "ratio", "hybridspec"):
        with pytest.raises(ValueError, match="D="):  # make_policy's check, or the engine's for unparameterised ones
            policy = make_policy(name, d.draft_len - 1, policy_parameters(d.draft_len - 1))
            engines[1].generate([1, 2, 3], policy=policy, max_new_tokens=4)
    with pytest.raises(ValueError, match="parameters are for D="):
        make_policy("ratio", d.draft_len, policy_parameters(d.draft_len - 1))


@pytest.mark.parametrize("name", POLICIES)
def test_resident_rounds_stop_at_eos_and_the_output_limit(session, engines, reference, name):
    """An EOS in the middle of a round and a limit shorter than a round truncate as on the host."""
    host, resident = engines
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompts, outs = reference
    for prompt, out in zip(prompts, outs):
        eos = next((t for i, t in enumerate(out) if i >= 5 and t not in out[:i]), None)
        if eos is not None:
            want = host.generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=(eos,))
            got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=(eos,))
            assert got.token_ids == want.token_ids == out[: out.index(eos) + 1]
            assert got.finish_reason == "eos"
        for limit in (1, 2, 7):
            got = resident.generate(prompt, policy=policy, max_new_tokens=limit)
            assert got.token_ids == out[:limit]
            assert all(r.w <= max(2, limit) or r.w == 1 for r in got.rounds)


@pytest.mark.parametrize("name", ("ar", "static:4", "hybridspec"))
def test_each_certain_round_is_launched_before_the_last_report_is_read(session, reference, name, monkeypatch):
    """Round i + 1 is launched before round i's report is read exactly where the budget past
    round i's w tokens makes it certain (`next_round_certain`); none is launched past the budget;
    after an EOS the round launched ahead is collected, so the host's lengths equal the device's
    positions."""
    engine = Engine(session.target, session.drafter, max_context=256, resident=True, graphs=False)
    resident, D = engine.resident, session.drafter.draft_len
    policy = make_policy(name, D, policy_parameters(D))
    need = policy.length if name.startswith("static") else 1
    log = []
    launch, collect = resident.launch, resident.collect

    def logged_launch(remaining):
        log.append(("launch", launched := launch(remaining)))
        return launched

    def logged_collect(launched):
        log.append(("collect", launched))
        return collect(launched)

    monkeypatch.setattr(resident, "launch", logged_launch)
    monkeypatch.setattr(resident, "collect", logged_collect)
    prompts, outs = reference
    stopped = 0
    for prompt, out in zip(prompts, outs):
        eos = next((t for i, t in enumerate(out) if i >= 5 and t not in out[:i]), None)
        for eos_ids in ((), (eos,)) if eos is not None else ((),):
            log.clear()
            got = engine.generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=eos_ids)
            assert got.token_ids == (out if not eos_ids else out[: out.index(eos) + 1])
            launched = [x for kind, x in log if kind == "launch"]
            collected = [x for kind, x in log if kind == "collect"]
            assert collected == launched  # each collected once, in launch order
            ends_early = bool(eos_ids) and len(got.token_ids) < TOKENS
            remaining = TOKENS - 1
            for i, record in enumerate(got.rounds):
                certain = remaining - launched[i].w >= need
                if i + 1 < len(launched):
                    ahead = log.index(("launch", launched[i + 1])) < log.index(("collect", launched[i]))
                    assert ahead == certain, (i, remaining, launched[i].w)
                remaining -= record.emitted
            last_certain = TOKENS - 1 - sum(r.emitted for r in got.rounds[:-1]) - launched[len(got.rounds) - 1].w >= need
            assert len(launched) == len(got.rounds) + (ends_early and last_certain)
            stopped += ends_early and last_certain
            assert int(engine.cache.position[0]) == engine.cache.length
            assert name == "ar" or int(resident.drafter.position[0]) == resident.drafter.length
    assert stopped  # some EOS came with a round launched after it


@pytest.mark.parametrize("name", ("ar", "full", "hybridspec"))
def test_a_request_closed_with_a_round_in_flight_leaves_the_next_request_exact(session, engines, reference, name):
    """A client that stops reading (the stream closed after two rounds, the third launched ahead and
    never collected) leaves nothing that changes the next request's tokens or positions."""
    _, resident = engines
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompts, outs = reference
    steps = resident.stream(prompts[0], policy=policy, max_new_tokens=TOKENS)
    for _ in range(3):  # the prefill's anchor, then two rounds
        next(steps)
    steps.close()
    got = resident.generate(prompts[1], policy=policy, max_new_tokens=TOKENS)
    assert got.token_ids == outs[1]
    assert int(resident.cache.position[0]) == resident.cache.length


def test_device_selector_equals_host_selector():
    """Eq. 5 and Eq. 6 on the device (tensors in, tensors out) against the host forms (ints)."""
    D, E, k = 15, 32, 4
    gen = torch.Generator().manual_seed(0)
    checked = expanded = 0
    for rho in (60.0, 400.0, 3000.0):
        nominal = make_policy("nominal", D, policy_parameters(D, rho=rho))
        hybrid = make_policy("hybridspec", D, policy_parameters(D, rho=rho))
        for _ in range(60):
            confidence = torch.rand(D, generator=gen)
            entropy = torch.rand(D, generator=gen) * 3
            w0_host, p_host = nominal.select(confidence, entropy)
            w0_dev, p_dev = nominal.nominal_length(confidence, entropy)
            assert int(w0_dev) == w0_host and torch.equal(p_dev, p_host)
            ids = torch.stack([torch.randperm(E, generator=gen)[:k] for _ in range(D + 1)])  # [W, k]
            for w_rem in (2, w0_host, w0_host + 1, D + 1):
                w_c_host = hybrid.correct(w0_host, p_host, ids, w_rem, E)
                w_c_dev = hybrid.corrected_length(torch.tensor(w0_host), p_dev, ids, torch.tensor(w_rem), E)
                assert int(w_c_dev) == w_c_host
                checked += 1
                expanded += w_c_host > w0_host
    assert checked == 720 and 0 < expanded < checked  # both outcomes of Eq. 6 occurred


def test_device_acceptance_equals_host_acceptance():
    gen = torch.Generator().manual_seed(1)
    for w in range(1, 17):
        for _ in range(20):
            logits = torch.randn(w, 11, generator=gen)
            y = logits.argmax(-1)
            draft = torch.where(torch.rand(w - 1, generator=gen) < 0.8, y[:-1], (y[:-1] + 1) % 11)
            accepted, y_dev = greedy_accepted(draft, y), y
            A, x_new = verify_greedy(draft, logits)
            assert int(accepted) == A and int(y_dev[A]) == x_new


@pytest.mark.parametrize("name", ("nominal", "hybridspec"))
def test_one_launch_selector_rounds_equal_the_host_rounds(session, engines, reference, name):
    """With the one-launch selector (`kernels/select`, interpreted here; the triton backend's
    default) the resident round chooses the host round's lengths: the same tokens, w0, w and
    acceptance as the host round, whose selector is the torch form."""
    host, _ = engines
    resident = Engine(session.target, session.drafter, max_context=256, resident=True, graphs=False)
    resident.resident.fused_select = True
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompts, outs = reference
    for prompt, ar_tokens in zip(prompts[:2], outs):
        want = host.generate(prompt, policy=policy, max_new_tokens=TOKENS)
        got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS)
        assert got.token_ids == want.token_ids == ar_tokens
        assert [(r.w0, r.w, r.accepted) for r in got.rounds] == [(r.w0, r.w, r.accepted) for r in want.rounds]



SAMPLE, FILTER = SamplingParams(temperature=1.0, seed=3), SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=11)


@pytest.mark.parametrize("name,sampling", [("ar", SAMPLE), ("full", FILTER), ("static:4", SAMPLE),
                                           ("hybridspec", SAMPLE), ("hybridspec", FILTER)],
                         ids=("ar-sample", "full-filter", "static-sample", "hybridspec-sample", "hybridspec-filter"))
def test_sampled_resident_rounds_equal_the_host_rounds(session, engines, name, sampling):
    """Sampling on the device (the point-mass rule with keyed draws, the parameters in device
    buffers): the resident round emits the host round's tokens, lengths and acceptance, and the
    same seed gives the same output twice."""
    host, resident = engines
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompt = session.codec.encode(PROMPTS[0])
    want = host.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling)
    got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling)
    assert got.token_ids == want.token_ids
    assert [(r.w, r.accepted) for r in got.rounds] == [(r.w, r.accepted) for r in want.rounds]
    assert resident.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling).token_ids == got.token_ids
    greedy = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS).token_ids
    assert greedy != got.token_ids  # the draws reached the output


@pytest.mark.parametrize("name,sampling", [("ar", SAMPLE), ("static:4", SAMPLE), ("hybridspec", SAMPLE),
                                           ("ar", FILTER), ("hybridspec", FILTER)],
                         ids=("ar-sample", "static-sample", "hybridspec-sample", "ar-top-k", "hybridspec-top-k"))
def test_kernel_point_mass_rounds_equal_the_host_rounds(session, engines, name, sampling):
    """With sampling's point-mass rule from the logits (`kernels/sampling`, interpreted here; the
    triton backend's default: one launch at a temperature, two under a top-k with top-p) the
    resident round emits the host round's tokens, lengths and acceptance, whose rule is the torch
    form over the (filtered) softmax."""
    host, _ = engines
    resident = Engine(session.target, session.drafter, max_context=256, resident=True, graphs=False)
    resident.resident.fused_sampling = True
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    prompt = session.codec.encode(PROMPTS[1])
    want = host.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling)
    got = resident.generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling)
    assert got.token_ids == want.token_ids
    assert [(r.w, r.accepted) for r in got.rounds] == [(r.w, r.accepted) for r in want.rounds]


def test_sampling_modes_name_the_graphs_a_request_needs():
    assert sampling_mode(SamplingParams()) == "greedy"
    assert sampling_mode(SamplingParams(temperature=0.6)) == "sample"
    assert sampling_mode(SamplingParams(temperature=0.6, top_k=20, top_p=0.95)) == "top_k"
    assert sampling_mode(SamplingParams(temperature=0.6, top_k=KERNEL_TOP_K)) == "top_k"
    assert sampling_mode(SamplingParams(temperature=0.6, top_k=KERNEL_TOP_K + 1)) == "filter"
    assert sampling_mode(SamplingParams(temperature=0.6, top_p=0.9)) == "filter"


@pytest.mark.parametrize("field, value", (("temperature", -0.5), ("top_k", -1), ("top_p", 0.0), ("top_p", 1.5),
                                          ("seed", 2**63), ("seed", -(2**63) - 1)))
def test_sampling_parameters_out_of_range_are_named(field, value):
    with pytest.raises(ValueError, match=f"^{field} must"):
        SamplingParams(**{field: value})
