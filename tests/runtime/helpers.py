"""Test doubles for the engine: a drafter that knows the true continuation, and hand-built policy
parameters."""

from __future__ import annotations

import torch

from hybridspec.artifacts.params import AcceptanceModel, PolicyParameters
from hybridspec.runtime.drafter import DraftOutput
from hybridspec.runtime.engine import Engine


class ScriptedDrafter:
    """Proposes the known greedy continuation with injected errors.

    Round r puts its first error at draft position `r mod (D + 2)` (no error when that is past D),
    so every acceptance count 0 … D occurs; later positions err with probability `noise`. Correct
    tokens get high confidence and low entropy, wrong ones the reverse."""

    feature_layers = (0,)

    def __init__(self, sequence: list[int], vocab: int, draft_len: int = 15, noise: float = 0.1, seed: int = 0):
        self.sequence, self.vocab, self.draft_len, self.noise = sequence, vocab, draft_len, noise
        self.gen = torch.Generator().manual_seed(seed)
        self.length, self.round = 0, 7 * seed  # spread the error schedule over prompts

    def reset(self, max_len: int) -> None:
        self.length = 0

    def extend(self, features: torch.Tensor) -> None:
        self.length += features.shape[1]

    def propose(self, anchor: int) -> DraftOutput:
        D, pos = self.draft_len, self.length  # the anchor sits at position `length`
        truth = [self.sequence[pos + i] if pos + i < len(self.sequence) else 0 for i in range(1, D + 1)]
        first_error = self.round % (D + 2)
        self.round += 1
        tokens, conf = [], []
        for i, t in enumerate(truth):
            wrong = i == first_error or (i > first_error and float(torch.rand(1, generator=self.gen)) < self.noise)
            tokens.append((t + 1) % self.vocab if wrong else t)
            u = float(torch.rand(1, generator=self.gen))
            conf.append(0.05 + 0.45 * u if wrong else 0.55 + 0.44 * u)
        confidence = torch.tensor(conf)
        entropy = (1.0 - confidence) * 2 + 0.05 * torch.rand(D, generator=self.gen)
        return DraftOutput(torch.tensor(tokens), confidence, entropy)


def policy_parameters(draft_len: int = 15, rho: float = 400.0) -> PolicyParameters:
    """A plausible calibration: acceptance rising with confidence, falling with entropy and position;
    a convex cost curve; routing tables where a new Layer-0 expert brings ~2 later-layer pairs."""
    W = draft_len + 1
    acceptance = AcceptanceModel(iso_x=((0.0, 0.5, 1.0),) * draft_len, iso_y=((0.02, 0.4, 0.98),) * draft_len,
                                 coef=(-2.0, 6.0, -0.05, 0.0, -0.8, -0.3))
    cost = tuple(0.0 if w < 2 else 1e-3 + 4e-4 * w + 2e-5 * w * w for w in range(W + 1))
    nbar_all = tuple(3.0 for _ in range(W + 1))
    nbar_cond = tuple(tuple(1.0 + 2.0 * n for n in range(4)) for _ in range(W + 1))
    return PolicyParameters(draft_len=draft_len, lengths=tuple(range(2, W + 1)), cost=cost, fixed_cost=2e-3,
                            rho=rho, s=1e-4, eta=1.5e-4, nbar_all=nbar_all, nbar_cond=nbar_cond,
                            acceptance=acceptance)


def prefilled_cache(target, prompt: list[int], W: int, capacity: int | None = None):
    """The cache of a host-driven engine after a prefill of `prompt` and a null commit over W round
    tokens (a commit of nothing): every pass of up to W tokens from it starts from the same state,
    each layer's pending commit re-armed first (`cache.pending`). capacity: the engine's context
    (prompt and generated tokens; default len(prompt) + 2 W)."""
    device = next(target.parameters()).device
    cache = Engine(target, None, max_context=capacity or len(prompt) + 2 * W, resident=False).cache
    cache.reset()
    target.prefill(torch.tensor([prompt], device=device), cache)
    target.enter_static(cache, W)
    return cache


def captured_pass(target, cache, block: torch.Tensor):
    """(graph, output) of one verification pass of `block` from the cache's state, warmed up on a
    side stream and captured as a CUDA graph (each replay re-arms nothing: set `cache.pending`)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        cache.pending = [True] * len(cache.pending)
        target.forward_pass(block, cache)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    cache.pending = [True] * len(cache.pending)
    with torch.cuda.graph(graph):
        out = target.forward_pass(block, cache)
    return graph, out


def pass_outputs(target, cache, block: torch.Tensor, *, graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, logits) copies of one verification pass of `block` [1, w] from the cache's state,
    each layer's (null) pending commit re-armed first: run eagerly, or captured as a CUDA graph
    (`captured_pass`) and replayed once."""
    if not graph:
        cache.pending = [True] * len(cache.pending)
        out = target.forward_pass(block, cache)
        return out.features.clone(), out.logits.clone()
    captured, out = captured_pass(target, cache, block)
    cache.pending = [True] * len(cache.pending)
    captured.replay()
    torch.cuda.synchronize()
    return out.features.clone(), out.logits.clone()


class RecordedGraphs:
    """CUDA graphs' bookkeeping on CPU: `capture` records the phase with the policy the decoder held
    while capturing (what a real graph bakes in); `replay` runs that phase under that policy, with
    the host state it finds put back afterwards (a replay does device work only)."""

    def __init__(self, decoder):
        self.decoder, self.graphs, self.captures = decoder, {}, 0

    def capture(self, key, run, restore):
        self.graphs[key] = (run, self.decoder.policy)
        self.captures += 1

    def forget(self):
        self.graphs.clear()

    def replay(self, key):
        run, policy = self.graphs[key]
        decoder, cache = self.decoder, self.decoder.cache
        held = decoder.policy, cache.slot, list(cache.pending), cache.pending_tokens
        decoder.policy = policy
        try:
            run()
        finally:
            decoder.policy, cache.slot, cache.pending, cache.pending_tokens = held
