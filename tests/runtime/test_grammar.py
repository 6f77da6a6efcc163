"""Structured output (runtime/grammar.py):

- `GrammarState.constrain` row by row equals a fresh matcher walked over that row's own drafts, and
  keeps every token in the rows after a draft the grammar refuses;
- `ar` under a grammar equals a teacher-forced oracle (each token the argmax of the logits masked
  by a matcher over its own history), and its output matches the grammar;
- every policy emits `ar`'s tokens under a grammar when greedy, and keeps to it when sampling;
- JSON, JSON-schema, regex and choice outputs parse as what they promised; bad grammars are named."""

from __future__ import annotations

import json
import re

import pytest
import torch

from hybridspec.runtime.grammar import GrammarCompiler, GrammarError, GrammarSpec, GrammarState
from hybridspec.runtime.policies import make_policy
from hybridspec.runtime.sampling import SamplingParams
from tests.runtime.helpers import RecordedGraphs, policy_parameters

PROMPT = 'config = {"name": '
TOKENS = 40
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "size": {"type": "integer"}}, "required": ["name", "size"]}


@pytest.fixture(scope="module")
def compiler(session):
    return GrammarCompiler(session.codec.tokenizer, session.target.cfg.vocab_size, session.eos_ids)


def state(session, compiler, spec: GrammarSpec) -> GrammarState:
    return GrammarState(compiler.compile(spec), session.eos_ids, session.target.cfg.vocab_size)


def allowed_after(session, compiler, spec, history: list[int]) -> torch.Tensor:
    """The tokens a fresh matcher allows after `history` [V] bool."""
    fresh = state(session, compiler, spec)
    fresh.accept(history)
    return fresh.constrain(torch.zeros(1, session.target.cfg.vocab_size))[0] > float("-inf")


def test_rows_follow_their_own_drafts(session, compiler):
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    st = state(session, compiler, spec)
    output = session.codec.encode('{"name": "a')
    st.accept(output)
    drafts = session.codec.encode('bc", "size": 1')
    w = len(drafts) + 1
    got = st.constrain(torch.zeros(w, session.target.cfg.vocab_size), drafts) > float("-inf")
    for i in range(w):
        assert torch.equal(got[i], allowed_after(session, compiler, spec, output + drafts[:i])), f"row {i}"
    assert got[0].sum() < session.target.cfg.vocab_size  # the grammar refuses most tokens
    # a refused draft: the rows after it keep every token, the state is as before
    bad = [drafts[0], int((~got[1]).nonzero()[0]), drafts[2]]
    rows = st.constrain(torch.zeros(4, session.target.cfg.vocab_size), bad) > float("-inf")
    assert not rows[1, bad[1]] and rows[2:].all()
    assert torch.equal(rows[0], got[0])


def test_ar_under_a_schema_equals_the_teacher_forced_oracle(session, engines, compiler):
    spec = GrammarSpec("json_schema", json.dumps(SCHEMA))
    prompt = session.codec.encode(PROMPT)
    engine = engines["host"]
    ar = make_policy("ar", session.drafter.draft_len)
    tokens = engine.generate(prompt, policy=ar, max_new_tokens=TOKENS, eos_ids=session.eos_ids,
                             grammar=state(session, compiler, spec)).token_ids
    assert tokens[-1] in session.eos_ids  # the object closed within the budget, then the end token
    value = json.loads(session.codec.decode(tokens[:-1]))
    assert set(value) == {"name", "size"} and isinstance(value["size"], int) and len(value["name"]) <= 12
    engine.cache.reset()
    logits = session.target.prefill(torch.tensor([prompt + tokens]), engine.cache, all_logits=True).logits
    logits = logits[0, len(prompt) - 1 : -1]
    engine.cache.reset()
    for i, token in enumerate(tokens):
        mask = allowed_after(session, compiler, spec, tokens[:i])
        assert int(logits[i].masked_fill(~mask, float("-inf")).argmax()) == token, f"token {i}"


SPECS = {"json": GrammarSpec("json"), "schema": GrammarSpec("json_schema", json.dumps(SCHEMA)),
         "regex": GrammarSpec("regex", r"[a-z_]{1,12} = [0-9]{1,4}"), "choice": GrammarSpec.choice(["yes", "no", "maybe"])}


def check_output(kind: str, text: str) -> None:
    if kind in ("json", "schema"):
        json.loads(text)
    elif kind == "regex":
        assert re.fullmatch(r"[a-z_]{1,12} = [0-9]{1,4}", text), text
    else:
        assert text in ("yes", "no", "maybe")


@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("temperature", (0.0, 0.9))
def test_every_policy_keeps_to_the_grammar_and_greedy_ones_emit_ar_tokens(session, engines, compiler, kind,
                                                                          temperature):
    """Greedy: every policy emits `ar`'s tokens. Sampled (the point-mass rule samples `ar`'s
    distribution, not its draws): every policy's output is a sentence of the grammar, or a prefix
    of one where the budget ended it."""
    prompt = session.codec.encode(PROMPT)
    sampling = SamplingParams(temperature, seed=3)
    runs = {}
    for name in ("ar", "static:4", "full", "hybridspec"):
        policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
        runs[name] = engines["host"].generate(prompt, policy=policy, max_new_tokens=TOKENS, sampling=sampling,
                                              eos_ids=session.eos_ids, grammar=state(session, compiler, SPECS[kind]))
    if temperature == 0:
        want = runs["ar"].token_ids
        assert all(r.token_ids == want for r in runs.values()), {n: r.token_ids for n, r in runs.items()}
    for name, run in runs.items():
        tokens = run.token_ids
        if tokens[-1] in session.eos_ids:
            check_output(kind, session.codec.decode(tokens[:-1]))
        else:  # the budget ended it: a prefix the grammar still allows
            assert len(tokens) == TOKENS and kind in ("json", "schema"), (name, session.codec.decode(tokens))


@pytest.mark.parametrize("name", ("ar", "static:4", "full", "nominal", "hybridspec"))
@pytest.mark.parametrize("temperature", (0.0, 0.9))
def test_resident_rounds_equal_host_rounds_under_a_grammar(session, engines, compiler, name, temperature):
    """The resident round masks its rows by the bitmasks the host fills (after reading the drafts)
    and emits the host rounds' tokens, greedy and sampled, for every kind of policy."""
    prompt = session.codec.encode(PROMPT)
    policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
    sampling = SamplingParams(temperature, seed=5)
    for kind in ("schema", "choice"):
        runs = [engines[path].generate(prompt, policy=policy, max_new_tokens=TOKENS, eos_ids=session.eos_ids,
                                       sampling=sampling, grammar=state(session, compiler, SPECS[kind]))
                for path in ("host", "resident")]
        got = [run.token_ids for run in runs]
        assert got[0] == got[1], kind
        assert [(r.w, r.accepted) for r in runs[0].rounds] == [(r.w, r.accepted) for r in runs[1].rounds], kind
        if got[0][-1] in session.eos_ids:
            check_output(kind, session.codec.decode(got[0][:-1]))


@pytest.mark.parametrize("spec, message", [
    (GrammarSpec("json_schema", '{"type": "objekt"}'), "json_schema grammar does not compile"),
    (GrammarSpec("json_schema", "{not json"), "json_schema grammar does not compile"),
    (GrammarSpec("regex", "[a-"), "regex grammar does not compile"),
    (GrammarSpec("ebnf", "root ::= "), "ebnf grammar does not compile"),
])
def test_a_bad_grammar_is_named(compiler, spec, message):
    with pytest.raises(GrammarError, match=message):
        compiler.compile(spec)


def test_bad_specs_and_no_end_token_are_refused(session, compiler):
    with pytest.raises(GrammarError, match="kind"):
        GrammarSpec("yaml")
    with pytest.raises(GrammarError, match="non-empty"):
        GrammarSpec.choice([])
    with pytest.raises(GrammarError, match="end token"):
        GrammarState(compiler.compile(GrammarSpec("json")), (), session.target.cfg.vocab_size)


def test_logprobs_under_a_grammar_are_the_raw_model_values(session, engines, compiler):
    """Logprobs stay the target's raw log-probabilities (as without a grammar): the alternatives
    include tokens the grammar refuses, and each value equals the unconstrained pass's."""
    prompt = session.codec.encode(PROMPT)
    ar = make_policy("ar", session.drafter.draft_len)
    got = engines["host"].generate(prompt, policy=ar, max_new_tokens=4, eos_ids=session.eos_ids, logprobs=5,
                                   grammar=state(session, compiler, SPECS["choice"]))
    free = engines["host"].generate(prompt, policy=ar, max_new_tokens=1, logprobs=5)
    first = session.codec.encode("yes")[0], session.codec.encode("no")[0], session.codec.encode("maybe")[0]
    assert got.token_ids[0] in first and got.logprobs.top[0] == free.logprobs.top[0]
    assert any(token not in first for token, _ in got.logprobs.top[0])


@pytest.mark.parametrize("path", ("host", "resident"))
def test_an_end_token_among_the_drafts_ends_the_output_as_ar_does(session, engines, compiler, monkeypatch, path):
    """A drafter that proposes `ar`'s continuation, its end token included, then anything: the rows
    after the end token keep every token, and `full` emits `ar`'s tokens."""
    from hybridspec.runtime.drafter import DraftOutput

    engine, D = engines[path], session.drafter.draft_len
    prompt = session.codec.encode(PROMPT)
    ar = make_policy("ar", D)
    for spec in (SPECS["choice"], SPECS["regex"]):
        want = engine.generate(prompt, policy=ar, max_new_tokens=TOKENS, eos_ids=session.eos_ids,
                               grammar=state(session, compiler, spec)).token_ids
        assert want[-1] in session.eos_ids
        propose = session.drafter.propose

        def oracle(anchor, want=want):  # the anchor is output token cache.length − len(prompt)
            out = propose(anchor)
            done = engine.cache.length - len(prompt) + 1
            tokens = (want[done:] + [5] * D)[:D]
            return DraftOutput(torch.tensor(tokens, device=out.tokens.device), out.confidence, out.entropy)

        monkeypatch.setattr(session.drafter, "propose", oracle)
        got = engine.generate(prompt, policy=make_policy("full", D), max_new_tokens=TOKENS, eos_ids=session.eos_ids,
                              grammar=state(session, compiler, spec))
        monkeypatch.setattr(session.drafter, "propose", propose)
        assert got.token_ids == want
        assert got.rounds[0].accepted >= 1  # the drafts were taken, the end token among them


def test_no_row_is_left_without_a_token(session, engines, compiler):
    """min_tokens beside a grammar that must end now, and a grammar with a dead end: the row allows
    the end tokens, so the output ends instead of emitting a refused token."""
    end = (7,)  # an end token other than token 0 (which an all −inf row's argmax would pick)
    choice = GrammarCompiler(session.codec.tokenizer, session.target.cfg.vocab_size, end)
    prompt = session.codec.encode(PROMPT)
    ar = make_policy("ar", session.drafter.draft_len)
    for temperature in (0.0, 1.0):
        got = engines["host"].generate(prompt, policy=ar, max_new_tokens=8, eos_ids=end,
                                       sampling=SamplingParams(temperature, seed=1, min_tokens=4),
                                       grammar=GrammarState(choice.compile(GrammarSpec.choice(["a"])), end,
                                                            session.target.cfg.vocab_size)).token_ids
        assert session.codec.decode(got[:-1]) == "a" and got[-1] == 7
    dead = state(session, compiler, GrammarSpec("ebnf", 'root ::= "ab" x\nx ::= x'))
    got = engines["resident"].generate(prompt, policy=make_policy("full", session.drafter.draft_len),
                                       max_new_tokens=8, eos_ids=session.eos_ids, grammar=dead).token_ids
    assert session.codec.decode(got[:-1]) == "ab" and got[-1] in session.eos_ids
    assert not state(session, compiler, GrammarSpec("ebnf", 'root ::= "a" x\nx ::= x')).complete
    assert state(session, compiler, SPECS["choice"]).allows_anything()


def test_a_grammar_after_reasoning_lets_the_block_run_free(session, compiler):
    st = state(session, compiler, SPECS["schema"].after_reasoning())
    st.accept(session.codec.encode('Any thought, even {"x" or <b>.</think>\n\n{"name": "ab", "size": 2}'))
    assert st.complete
    direct = state(session, compiler, SPECS["schema"].after_reasoning())
    direct.accept(session.codec.encode('{"name": "ab", "size": 2}'))
    assert not direct.complete  # still reasoning: the grammar starts after </think>


def test_forced_calls_are_the_whole_output(session, compiler):
    """tool_choice required: the output is calls only, no text before, between or after them; with
    parallel_tool_calls false one call completes it, with parallel calls a second may follow on
    the next line."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}]
    call = session.codec.encode('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>')
    vocab = session.target.cfg.vocab_size

    def allowed(st, text: str) -> bool:
        return bool(st.constrain(torch.zeros(1, vocab))[0][session.codec.encode(text)[0]] > float("-inf"))

    for parallel in (True, False):
        spec = GrammarSpec.tool_calls("hermes", tools, "required", "disabled", parallel=parallel)
        fresh = state(session, compiler, spec)
        assert allowed(fresh, "<") and not allowed(fresh, "x")  # the first call starts at once
        st = state(session, compiler, spec)
        st.accept(call)
        assert st.complete
        assert not allowed(st, "x") and not allowed(st, "#")  # nothing but another call after one
        assert allowed(st, "\n") == parallel, parallel
        assert bool((st.constrain(torch.zeros(1, vocab))[0][list(session.eos_ids)] > float("-inf")).any())
        if parallel:
            st.accept(session.codec.encode("\n"))
            assert allowed(st, "<") and not st.complete


class WarmedGraphs(RecordedGraphs):
    """`RecordedGraphs` closer to `graphs.Graphs`: `capture` runs the phase twice (warm-up and
    capture) in the host state `restore` sets, putting it back after each, and keeps that state
    (which GDN layers wait for a commit: what the captured work folds); `replay` checks that the
    host is in it before running the phase."""

    def __init__(self, decoder):
        super().__init__(decoder)
        self.states = {}

    def capture(self, key, run, restore):
        cache = self.decoder.cache
        self.states[key] = (list(cache.pending), cache.pending_tokens)
        for _ in range(2):
            run()
            restore()
        super().capture(key, run, restore)

    def replay(self, key):
        cache = self.decoder.cache
        assert (cache.pending, cache.pending_tokens) == self.states[key], key  # the host's flags are the graph's
        super().replay(key)


@pytest.mark.parametrize("name", ("ar", "static:4", "full", "nominal", "hybridspec"))
def test_graph_phases_under_a_grammar_capture_and_replay_in_their_host_states(session, engines, compiler, name):
    """The grammar's split phases (pass, then acceptance and commit) captured in the host state
    the round reaches them in, and replayed as graphs replay (host state put back, then `_launch`'s
    own update): the host rounds' tokens, and the eagerly run resident rounds' lengths."""
    from hybridspec.runtime.engine import Engine

    t, d = session.target, session.drafter
    graphed = Engine(t, d, max_context=256, resident=True, graphs=False)
    graphed.resident.graphs = WarmedGraphs(graphed.resident)
    policy = make_policy(name, d.draft_len, policy_parameters(d.draft_len))
    prompt = session.codec.encode(PROMPT)
    for kind in ("schema", "choice"):
        kw = dict(policy=policy, max_new_tokens=TOKENS, eos_ids=session.eos_ids)
        host = engines["host"].generate(prompt, grammar=state(session, compiler, SPECS[kind]), **kw)
        eager = engines["resident"].generate(prompt, grammar=state(session, compiler, SPECS[kind]), **kw)
        got = graphed.generate(prompt, grammar=state(session, compiler, SPECS[kind]), **kw)
        assert got.token_ids == eager.token_ids == host.token_ids, kind
        assert [(r.w, r.accepted) for r in got.rounds] == [(r.w, r.accepted) for r in eager.rounds], kind
    sampled = dict(kw, sampling=SamplingParams(0.9, seed=2), logprobs=3)  # point-mass acceptance, logprobs
    eager = engines["resident"].generate(prompt, grammar=state(session, compiler, SPECS["schema"]), **sampled)
    got = graphed.generate(prompt, grammar=state(session, compiler, SPECS["schema"]), **sampled)
    assert got.token_ids == eager.token_ids and got.logprobs.chosen == eager.logprobs.chosen
