"""The decoding engine: prefill, autoregressive decoding and speculative rounds (DESIGN A.8).

One speculative round, as pure steps over the target, the drafter and the policy:

    draft → select w0 → stage 0 on u tokens → routing correction → stage 1 on w tokens
          → accept (greedy or point-mass) → commit m = A + 1 tokens

Batch size one, as the paper. Every round leaves a `RoundRecord` for the collectors.

Two implementations of the round share the model: the host-driven one below (decisions read back
to the host between phases; the oracle, and the only one that records routing), and
the GPU-resident one of `resident.py` (decisions on the device, CUDA graphs on a GPU), which
requests use when the engine is built with `resident=True` (the default on CUDA with a Triton
backend). Both sample with the same keyed draws (`sampling.py`), so they emit the same tokens.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .drafter import DFlashDrafter, DraftOutput
from .grammar import GrammarState
from .backends import device_resident, drafter_ops
from .logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, from_rows, logprob_rows, token_logprobs
from .models.hybrid import HybridTarget
from .policies import Policy
from .penalties import PenaltyState, penalized
from .resident import Report, ResidentDecoder, fused_request_ops
from .sampling import SamplingParams, choose, verify_greedy, verify_point_mass


StopAt = Callable[[list[int], int], int | None]  # (output ids, ids already shown) → the length to end at, or None


@dataclass
class RoundRecord:
    w0: int | None  # nominal length (None for ar)
    u: int  # Stage-0 length
    w: int  # executed verification length (counts the anchor)
    accepted: int  # A
    accepted_full: int | None  # A_D, when all D draft tokens were verified
    emitted: int  # tokens this round added to the output (after truncation)
    truncated: bool  # cut short by EOS or the output limit
    draft_tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    layer0_experts: Tensor | None = None  # [u, k] expert ids of the Stage-0 tokens
    expert_ids: list[Tensor] | None = None  # per MoE layer [w, k], when routing is recorded
    seconds: dict[str, float] = field(default_factory=dict)
    logprobs: TokenLogprobs | None = None  # of the emitted tokens, when the request asks for them

    @classmethod
    def autoregressive(cls, seconds: dict[str, float], logprobs: TokenLogprobs | None = None) -> "RoundRecord":
        """An `ar` step: one token verified, emitted and committed."""
        return cls(w0=None, u=1, w=1, accepted=0, accepted_full=None, emitted=1, truncated=False, seconds=seconds,
                   logprobs=logprobs)


@dataclass
class PrefillRecord:
    """What the prefill's step leaves beside the first token: its logprobs, and the prompt's (of
    prompt tokens 1 … T − 1, each decided by the row before it), when asked for."""

    logprobs: TokenLogprobs | None = None
    prompt_logprobs: TokenLogprobs | None = None


@dataclass
class GenerationResult:
    token_ids: list[int]  # generated ids only
    finish_reason: str  # "eos" (an end token), "length", or "stop" (`Engine.generate`'s `stop` ended it)
    rounds: list[RoundRecord]
    prefill_seconds: float
    decode_seconds: float  # after the prefill-produced anchor
    logprobs: TokenLogprobs | None = None  # of every generated token, when asked for

    @property
    def decode_tokens(self) -> int:
        """Tokens emitted after the prefill-produced anchor (DESIGN A.10)."""
        return len(self.token_ids) - 1

    @property
    def acceptance_length(self) -> float:
        return self.decode_tokens / len(self.rounds) if self.rounds else 0.0

    @property
    def mean_verification_length(self) -> float:
        return sum(r.w for r in self.rounds) / len(self.rounds) if self.rounds else 0.0


class Clock:
    """Wall-clock phases; synchronizes the device so that a phase's time is its own."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class Engine:
    def __init__(self, target: HybridTarget, drafter: DFlashDrafter | None = None, *, max_context: int = 4096,
                 resident: bool | None = None, graphs: bool | None = None):
        """resident: requests decode with the GPU-resident round, greedy or sampled, unless they
        record routing (default: on CUDA with a Triton backend, whose MoE reads nothing back); graphs: capture its phases as CUDA graphs
        (default: whenever resident runs on CUDA; False keeps it eager, the graphs' oracle)."""
        self.target, self.drafter, self.max_context = target, drafter, max_context
        self.device = target.embed_tokens.weight.device
        self.clock = Clock(self.device)
        width = drafter.draft_len + 1 if drafter is not None else 1
        if drafter is not None and tuple(drafter.feature_layers) != target.feature_layers:
            raise ValueError(f"the drafter reads target layers {tuple(drafter.feature_layers)}; the target was built "
                             f"to expose {target.feature_layers} (load_target(feature_layers=...))")
        self.cache = target.new_cache(max_len=max_context + width, tokens_per_pass=max(64, width))
        if isinstance(drafter, DFlashDrafter):  # the drafter's ops by the target's backend
            drafter.set_ops(**drafter_ops(target.backend))
        cuda = self.device.type == "cuda"
        if resident is None:
            resident = cuda and device_resident(target.backend)
        if graphs is None:
            graphs = resident and cuda
        # the request's token history and logits changes: penalties, logit bias, min_tokens, min_p (`penalties.py`)
        self.penalties = PenaltyState.allocate(target.cfg.vocab_size, self.device)
        self.fused_requests = fused_request_ops(target.backend)  # logprobs, penalties, masks: as the resident rounds
        self.resident = (ResidentDecoder(target, drafter, self.cache, graphs=graphs, penalties=self.penalties)
                         if resident else None)
        self._policies: dict[str, tuple[Policy, Policy]] = {}  # host rounds: name → (as given, on the device)
        self.grammar: GrammarState | None = None  # the current request's: its prefill token and host rounds
        self.requests = 0  # `stream` calls so far: a stream decodes only while its request is the latest

    def prepare(self, policy: Policy, sampling: SamplingParams = SamplingParams(), *, logprobs: bool = False,
                grammar: bool = False) -> None:
        """Capture the policy's CUDA graphs for this kind of sampling (with logprobs or without, with
        a grammar or without) now (a server does this at start-up; otherwise the first such request
        of each policy does it before its prefill)."""
        if self.resident is not None:
            self.resident.prepare(policy, sampling, logprobs=logprobs, grammar=grammar)

    # ---------------------------------------------------------------- public
    def generate(self, prompt_ids: list[int], *, policy: Policy, max_new_tokens: int,
                 sampling: SamplingParams = SamplingParams(), eos_ids: tuple[int, ...] = (),
                 record_routing: bool = False, logprobs: int | None = None,
                 grammar: GrammarState | None = None, stop: StopAt | None = None) -> GenerationResult:
        """Decode a request whole (`stream`). `stop(ids, seen)` is asked after the prefill and each
        round, with the output so far and how many of its ids it was shown before: a length it
        returns, in (seen, len(ids)], ends the output there with finish_reason "stop" and no
        further round runs (`ending.StopSequences.length`: stop sequences)."""
        self.check(prompt_ids, policy=policy, max_new_tokens=max_new_tokens, sampling=sampling)
        if not record_routing:  # graph capture is start-up work, not the prefill's
            self.prepare(policy, sampling, logprobs=logprobs is not None, grammar=grammar is not None)
        steps = self.stream(prompt_ids, policy=policy, max_new_tokens=max_new_tokens, sampling=sampling,
                            eos_ids=eos_ids, record_routing=record_routing, logprobs=logprobs, grammar=grammar)
        start = self.clock.now()
        tokens, prefill = next(steps)  # the prefill-produced anchor
        decode_start = self.clock.now()
        rounds: list[RoundRecord] = []
        seen = 0  # output ids the stop has been shown before the latest step's
        cut = stop(tokens, seen) if stop is not None else None
        while cut is None and (step := next(steps, None)) is not None:
            new, record = step
            seen = len(tokens)
            tokens.extend(new)
            rounds.append(record)
            cut = stop(tokens, seen) if stop is not None else None
        steps.close()  # a stop leaves the remaining rounds undecoded
        end = self.clock.now()
        if cut is not None:
            if not seen < cut <= len(tokens):
                raise ValueError(f"stop returned {cut}: not past the {seen} ids it had seen, or past all {len(tokens)}")
            _cut_last_round(tokens, rounds, cut)
        reason = "stop" if cut is not None else "eos" if tokens[-1] in set(eos_ids) else "length"
        lps = None
        if logprobs is not None:
            lps = TokenLogprobs()
            for part in (prefill, *rounds):
                lps.extend(part.logprobs)
        return GenerationResult(tokens, reason, rounds, decode_start - start, end - decode_start, lps)

    def check(self, prompt_ids: list[int], *, policy: Policy, max_new_tokens: int,
              sampling: SamplingParams | None = None) -> None:
        """Raise ValueError when the request cannot run (empty prompt, ids outside the vocabulary,
        context, missing drafter, logit_bias ids outside the vocabulary)."""
        if not prompt_ids:
            raise ValueError("prompt is empty")
        vocab = self.target.cfg.vocab_size
        bad = [i for i in prompt_ids if not 0 <= i < vocab]
        if bad:
            raise ValueError(f"prompt ids {bad[:5]} are outside the vocabulary of {vocab}")
        if sampling is not None:
            bad = [i for i, _ in sampling.logit_bias if not 0 <= i < vocab]
            if bad:
                raise ValueError(f"logit_bias ids {bad[:5]} are outside the vocabulary of {vocab}")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer ≥ 1, got {max_new_tokens!r}")
        if len(prompt_ids) + max_new_tokens > self.max_context:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) exceeds the context "
                             f"of {self.max_context} tokens (--max-context)")
        if policy.speculative and self.drafter is None:
            raise ValueError(f"policy {policy.name!r} is speculative and needs a drafter")
        if policy.speculative and policy.draft_len != self.drafter.draft_len:
            raise ValueError(f"policy {policy.name!r} is for D={policy.draft_len} draft tokens; the drafter drafts "
                             f"D={self.drafter.draft_len}")

    def stream(self, prompt_ids: list[int], *, policy: Policy, max_new_tokens: int,
               sampling: SamplingParams = SamplingParams(), eos_ids: tuple[int, ...] = (),
               record_routing: bool = False, logprobs: int | None = None,
               prompt_logprobs: int | None = None,
               grammar: GrammarState | None = None) -> Iterator[tuple[list[int], RoundRecord | PrefillRecord]]:
        """Decode round by round: yields ([anchor], PrefillRecord) after the prefill, then (emitted
        ids, record) per round. `logprobs`: each record carries its tokens' logprobs with that many
        alternatives (`logprobs.py`; at most MAX_TOP_LOGPROBS); `prompt_logprobs`: the prefill's
        record carries the prompt's; `grammar`: the output is held to it (`grammar.py`). Closing
        the generator early stops decoding (the next request resets the cache); a generator that a
        later request of this engine overtook raises RuntimeError instead of decoding from that
        request's caches."""
        self.check(prompt_ids, policy=policy, max_new_tokens=max_new_tokens, sampling=sampling)
        for name, count in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
            if count is not None and not 0 <= count <= MAX_TOP_LOGPROBS:
                raise ValueError(f"{name} must be in 0 … {MAX_TOP_LOGPROBS}, got {count}")
        resident = self.resident if self.resident is not None and not record_routing else None
        given = policy
        if resident is not None:  # graphs are captured before this request's caches are filled
            policy = resident.prepare(given, sampling, logprobs=logprobs is not None, grammar=grammar is not None)
        else:
            policy = self._on_device(given)
        self.requests += 1
        request = self.requests
        self.cache.reset()
        prompt = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        rows: list[Tensor] = []  # logprob_rows of the prompt's rows, chunk by chunk

        def keep(logits: Tensor, start: int) -> None:  # row j decides prompt token j + 1
            decided = prompt[0, start + 1 : start + 1 + logits.shape[1]]
            rows.append(logprob_rows(logits[0, : decided.shape[0]], decided, prompt_logprobs, self.fused_requests))

        out = self.target.prefill(prompt, self.cache, each_chunk=keep if prompt_logprobs is not None else None)
        if policy.speculative:
            self.drafter.reset(self.cache.max_len)
            self.drafter.extend(out.features)
        if sampling.penalized:
            self.penalties.begin(prompt_ids, sampling, tuple(eos_ids))
        self.grammar = grammar
        logits = self._penalized(self._constrained(out.logits[0, -1:], None), None, sampling)
        last, produced = choose(logits[0], sampling, len(prompt_ids)), 1
        self._record([last], sampling)
        first = token_logprobs(out.logits[0, -1:], [last], logprobs, self.fused_requests) if logprobs is not None else None
        of_prompt = from_rows(torch.cat(rows).tolist(), prompt_logprobs) if prompt_logprobs is not None else None
        yield [last], PrefillRecord(first, of_prompt)
        eos = set(eos_ids)
        if resident is not None and last not in eos and produced < max_new_tokens:
            self._check_current(request)
            resident.begin(given, last, max_new_tokens - produced, sampling, logprobs=logprobs, grammar=grammar)
            yield from _resident_rounds(resident, policy, max_new_tokens - produced, eos,
                                        lambda: self._check_current(request))
            return
        while last not in eos and produced < max_new_tokens:
            self._check_current(request)
            remaining = max_new_tokens - produced
            if policy.speculative:
                new, record = self._speculative_round(last, policy, remaining, sampling, record_routing, logprobs)
            else:
                new, record = self._autoregressive_step(last, sampling, logprobs)
            new = _emitted(new, record, remaining, eos)
            last, produced = new[-1], produced + len(new)
            yield new, record

    def _check_current(self, request: int) -> None:
        """RuntimeError unless `request` (a count of `stream` calls) is the engine's latest: the
        caches, the drafter's context, the penalties and the grammar hold one request's state."""
        if request != self.requests:
            raise RuntimeError("this stream was overtaken by a later request on the same Engine (one request at a "
                               "time: finish or close a stream before starting another)")

    def _on_device(self, policy: Policy) -> Policy:
        """The policy with its tensors on the engine's device for host rounds (one copy per policy name;
        the resident round keeps its own, made by `ResidentDecoder.prepare`)."""
        if policy.name not in self._policies or self._policies[policy.name][0] is not policy:
            self._policies[policy.name] = (policy, policy.to(self.device))
        return self._policies[policy.name][1]

    # ---------------------------------------------------------------- steps
    def _autoregressive_step(self, anchor: int, sampling, logprobs: int | None) -> tuple[list[int], RoundRecord]:
        t0 = self.clock.now()
        position = self.cache.length + 1  # of the token this pass decides (the anchor's is cache.length)
        out = self.target.forward_pass(self._ids([anchor]), self.cache)
        self.target.commit(self.cache, 1, 1)
        logits = self._penalized(self._constrained(out.logits[0, :1], None), None, sampling)
        token = choose(logits[0], sampling, position)
        self._record([token], sampling)
        lps = token_logprobs(out.logits[0, :1], [token], logprobs, self.fused_requests) if logprobs is not None else None
        record = RoundRecord.autoregressive({"total": self.clock.now() - t0}, lps)
        return [token], record

    def _speculative_round(self, anchor: int, policy: Policy, remaining: int, sampling, record_routing: bool,
                           logprobs: int | None) -> tuple[list[int], RoundRecord]:
        clock, target, W = self.clock, self.target, policy.max_length
        t0 = clock.now()
        position = self.cache.length + 1  # of the token the pass's first row decides
        draft = self.drafter.propose(anchor)
        t_draft = clock.now()
        w0, p_hat = policy.select(draft.confidence, draft.entropy)
        w_rem = max(2, min(remaining, W))  # the longest length the output budget allows
        two_stage = policy.corrects_routing  # Stage 0 runs one extra token for the correction
        u = min(w0 + 1, w_rem) if two_stage else min(w0, w_rem)
        t_select = clock.now()
        s0 = target.stage0(self._ids([anchor, *draft.tokens[: u - 1].tolist()]), self.cache)
        t_stage0 = clock.now()
        w_c = w0
        if two_stage and u == w0 + 1:
            w_c = policy.correct(w0, p_hat, s0.expert_ids[0], w_rem, target.cfg.num_experts)
        w = min(w_c, w_rem)
        out = target.stage1(s0, w, self.cache, record_routing=record_routing)
        t_stage1 = clock.now()
        logits = self._penalized(self._constrained(out.logits[0], draft.tokens), draft.tokens, sampling)
        accepted, x_new = self._accept(draft, logits, w, sampling, position)
        tokens = [*draft.tokens[:accepted].tolist(), x_new]
        self._record(tokens, sampling)
        target.commit(self.cache, w, accepted + 1)
        self.drafter.extend(out.features[:, : accepted + 1])
        t_end = clock.now()
        lps = token_logprobs(out.logits[0, : accepted + 1], tokens, logprobs, self.fused_requests) if logprobs is not None else None
        record = RoundRecord(
            w0=w0, u=u, w=w, accepted=accepted, accepted_full=accepted if w == W else None, emitted=0,
            truncated=w < w_c,  # the output budget shortened the round
            draft_tokens=draft.tokens.tolist(), confidence=draft.confidence.tolist(),
            entropy=draft.entropy.tolist(), layer0_experts=s0.expert_ids[0].cpu(),
            expert_ids=[ids[0].cpu() for ids in out.expert_ids] if out.expert_ids else None,
            seconds={"draft": t_draft - t0, "select": t_select - t_draft, "stage0": t_stage0 - t_select,
                     "stage1": t_stage1 - t_stage0, "commit": t_end - t_stage1, "total": t_end - t0},
            logprobs=lps,
        )
        return tokens, record

    @staticmethod
    def _accept(draft: DraftOutput, logits: Tensor, w: int, sampling: SamplingParams, position: int) -> tuple[int, int]:
        proposed = draft.tokens[: w - 1]  # [w−1]; logits [w, V]
        if sampling.greedy:
            return verify_greedy(proposed, logits)
        return verify_point_mass(proposed, logits, sampling, position)

    def _penalized(self, logits: Tensor, drafts: Tensor | None, sampling: SamplingParams) -> Tensor:
        """logits [w, V] under the request's penalties (row i after drafts d_1 … d_i), or as they are."""
        if not sampling.penalized:
            return logits
        drafts = drafts if drafts is not None else torch.zeros(0, dtype=torch.long, device=logits.device)
        return penalized(logits, drafts.to(logits.device), self.penalties, self.fused_requests)

    def _constrained(self, logits: Tensor, drafts: Tensor | None) -> Tensor:
        """logits [w, V] with the tokens the request's grammar refuses at each row at −inf (row i
        after drafts d_1 … d_i), or as they are."""
        if self.grammar is None:
            return logits
        return self.grammar.constrain(logits, drafts.tolist() if drafts is not None else None, self.fused_requests)

    def _record(self, tokens: list[int], sampling: SamplingParams) -> None:
        if sampling.penalized:
            self.penalties.record(torch.tensor(tokens, dtype=torch.long, device=self.device))
        if self.grammar is not None:
            self.grammar.accept(tokens)

    def _ids(self, ids: list[int]) -> Tensor:
        return torch.tensor([ids], dtype=torch.long, device=self.device)


def _resident_rounds(resident: ResidentDecoder, policy: Policy, remaining: int, eos: set[int],
                     check_current) -> Iterator[tuple[list[int], RoundRecord]]:
    """Resident rounds until EOS or the budget: each launched before the previous one's report is
    read wherever the budget makes it certain to run, so that the host's reading, truncation and
    yield overlap the GPU's next round. A round launched after the one that emits EOS is
    collected and dropped (its commit stays in the caches, which the next request resets). One
    launched after the round at which the consumer closes the stream (a stop) is left uncollected:
    the next request's kernels run after it on the same stream, and its reset of the caches, the
    drafter and the request state covers what that round wrote. `check_current` raises when a
    later request overtook this one while it waited at a yield."""
    launched = resident.launch(remaining)
    while True:
        ahead = None
        if resident.next_round_certain(launched, remaining):
            ahead = resident.launch(remaining - launched.w)
        new, record = _resident_record(resident.collect(launched), policy)
        new = _emitted(new, record, remaining, eos)
        remaining -= len(new)
        yield new, record
        check_current()
        if new[-1] in eos or remaining == 0:
            if ahead is not None:
                resident.collect(ahead)  # the host's lengths follow the device's
            return
        launched = ahead if ahead is not None else resident.launch(remaining)


def _cut_last_round(tokens: list[int], rounds: list[RoundRecord], length: int) -> None:
    """Cut the output to `length` tokens, all dropped ones the last round's (a stop's length is
    past the ids it was shown before that round), with the round's emitted count and logprobs."""
    dropped = len(tokens) - length
    del tokens[length:]
    if dropped:
        last = rounds[-1]
        last.emitted -= dropped
        last.truncated = True
        if last.logprobs is not None:
            last.logprobs = last.logprobs.head(last.emitted)


def _emitted(new: list[int], record: RoundRecord, remaining: int, eos: set[int]) -> list[int]:
    """A round's tokens truncated (`_truncate`), with the record's emitted count, truncation and logprobs."""
    new, cut = _truncate(new, remaining, eos)
    record.truncated = record.truncated or cut or new[-1] in eos
    record.emitted = len(new)
    if record.logprobs is not None:
        record.logprobs = record.logprobs.head(len(new))
    return new


def _resident_record(report: Report, policy: Policy) -> tuple[list[int], RoundRecord]:
    """A resident round's report as the host round's (tokens, record); Stage 0 ran the whole block
    (u = W) under the routing correction."""
    if not policy.speculative:
        return report.tokens, RoundRecord.autoregressive(report.seconds, report.logprobs)
    W = policy.max_length
    u = W if policy.corrects_routing else report.w
    record = RoundRecord(
        w0=report.w0, u=u, w=report.w, accepted=report.accepted,
        accepted_full=report.accepted if report.w == W else None, emitted=0,
        truncated=report.w < report.w_c,  # the output budget shortened the round
        draft_tokens=report.draft_tokens, confidence=report.confidence, entropy=report.entropy,
        layer0_experts=torch.tensor(report.layer0_experts, dtype=torch.long), seconds=report.seconds,
        logprobs=report.logprobs)
    return report.tokens, record


def _truncate(new: list[int], remaining: int, eos: set[int]) -> tuple[list[int], bool]:
    """Cut a round's tokens after the first EOS and at the output limit (DESIGN A.1)."""
    cut = len(new)
    for i, token in enumerate(new):
        if token in eos:
            cut = i + 1
            break
    cut = min(cut, remaining)
    return new[:cut], cut < len(new)
