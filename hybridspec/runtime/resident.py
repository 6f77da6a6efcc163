"""The GPU-resident round (DESIGN B.9): every decision of a round on the device, each phase one
CUDA graph, and the host reading what it must once per phase that needs it.

One round, by policy (the graphs are captured by `prepare`, before the request's prefill):

    ar           step         anchor → target pass of 1 → argmax (or sample) → commit      1 graph
    static, full round(w)     draft → target pass of w → accept → commit               1 graph
    nominal, …   select       draft → Eq. 5 → w = min(w0, w_rem)              → read w
                 verify(w)    target pass of w → accept → commit              2 graphs
    hybridspec   select       draft → Eq. 5 → Stage 0 on the whole block → Eq. 6 → read w
                 resume(w)    Stage 1 on w → accept → commit                  2 graphs
    (a grammar)  the verification as pass(w) → fill the rows on the host → accept(w): one graph more

and then one copy of the round's report (emitted tokens, their count, w0, w, the draft) to the
host. `launch` enqueues a round and its report's copy, `collect` waits for the report: the engine
launches the next round before it collects the last wherever the budget makes that round certain
(`next_round_certain`), so the host's reading of one round overlaps the GPU's next. `w_rem` (the
longest length the output budget allows) is kept on the device. Acceptance is greedy, or the
point-mass rule with keyed draws (`sampling.point_mass`: the request's seed, the
sampling parameters and the positions are device values; on the triton backend one or two launches
from the logits, `kernels/sampling`, unless a filter needs a sort), so sampled requests run the same
graphs' shapes; each sampling mode (`sampling_mode`) has its own graphs. A request that asks for
logprobs runs graphs of its own, which also write `logprobs.logprob_rows` of the pass's rows to a
buffer copied to the host beside the report; so does one with penalties, a logit bias, min_tokens
or min_p (`penalties.py`), whose graphs read the request's token counts on the device and add
each round's emitted tokens to them. A request held to a grammar (`grammar.py`) runs graphs of its
own too, which mask each row by a bitmask the host fills from the grammar's state. Its
verification is two phases, the pass (`pass`, its logits and features kept in static buffers) and
the acceptance and commit (`accept`), and the host fills the rows while the pass runs: `ar`'s row
from the state after the last report; a speculative round's rows after its drafts are read (a
fixed policy's draft is then a phase of its own, `draft`; a nominal policy's `select` read of w
reads the drafts too). Such rounds are not launched ahead: the grammar advances with each report.

Stage 0 runs over the whole block (u = W) rather than u = min(w0 + 1, w_rem), so that the round
needs one read (w) instead of two (u, then w): GDN and routing are causal, so the first u rows of
a W-token Stage 0 are those of a u-token one, and Stage 1 reads only its first w ≤ u rows
(DESIGN A.6's condition). The rows past u cost Layer 0's GDN and router only, both of which
read their weights once whatever the tokens.

Shapes are static: attention reads the whole key cache under a mask built from device positions
(`TargetCache.key_span`), a pending GDN commit always covers `W` round tokens (Eq. 7 gives the
tokens past m weight exactly 0), and all data that passes between graphs lives in buffers
allocated before any capture. The target's factor slot alternates every pass, so each graph that
runs the target is captured once per slot parity; host state (`slot`, `pending`) is advanced by
`_launch` after each replay (the host half of a commit).

Without graphs (`graphs=False`, and on CPU) the same functions run eagerly: that is the oracle
the graph path is tested against, and the path the CPU tests exercise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..kernels.finish import reference as finish_reference
from ..kernels.sampling import KERNEL_TOP_K
from .cache import TargetCache
from .drafter import DFlashDrafter
from .grammar import GrammarState, masked
from .graphs import Graphs, PhaseTimer
from .logprobs import MAX_TOP_LOGPROBS, TokenLogprobs, from_rows, logprob_rows
from .models.hybrid import HybridTarget, Stage0
from .penalties import PenaltyState, penalized
from .policies import FixedPolicy, HybridSpecPolicy, NominalPolicy, Policy
from .sampling import SamplingParams, point_mass, sampling_probs

FUSED_SAMPLING = True  # off: the torch form on every backend (`bench/gpu_round.py --variants torch-sampling`)
# logprob rows, penalties and a grammar's masks as the kernels of `kernels/logprobs`, `kernels/penalties` and
# `kernels/bitmask` on the triton backend; off: their torch forms on every backend
# (`bench/gpu_round.py --variants torch-request-ops`)
FUSED_REQUEST_OPS = True


def fused_request_ops(backend: str) -> bool:
    """Whether logprob rows, penalties and a grammar's masks run as Triton kernels on `backend` (the
    host rounds and the resident rounds of one engine decide alike, so their tokens and logprobs
    agree exactly)."""
    return backend != "torch" and FUSED_REQUEST_OPS


@dataclass
class Buffers:
    """Everything a round passes between graphs or to the host, allocated before any capture."""

    anchor: Tensor  # [1] long   the next anchor x0
    block: Tensor  # [1, W] long  (x0, d1 … dD)
    confidence: Tensor  # [D] fp32
    entropy: Tensor  # [D] fp32
    w0: Tensor  # [1] long
    w_c: Tensor  # [1] long   after the routing correction
    w: Tensor  # [1] long   executed length: min(w_c, w_rem)
    remaining: Tensor  # [1] long   output budget (tokens still to emit) of a speculative request
    m: Tensor  # [1] long   tokens the round commits (A + 1)
    seed: Tensor  # [1] long   the request's sampling seed, and its parameters (`sampling.sampling_probs`)
    inv_temperature: Tensor  # [1] fp32
    top_k: Tensor  # [1] long
    top_p: Tensor  # [1] fp32
    report: Tensor  # [4 + W + 3D + W·k] fp32: m, w0, w_c, w, emitted tokens [W], drafts, confidence,
    #                  entropy [D], Layer 0's expert ids of the round's Stage-0 tokens [W, k] (−1 past them)
    host_reports: Tensor  # [2, size]: two host copies (pinned on CUDA), so that one round's report is
    # read while the next round's is copied
    logprobs: Tensor  # [W, 1 + 2·top] fp32: `logprobs.logprob_rows` of the round's rows (requests that ask)
    host_logprobs: Tensor  # [2, W, 1 + 2·top]: its host copies, as `host_reports`
    bitmask: Tensor  # [W, ⌈V/32⌉] int32: the grammar's allowed tokens per row (requests with a grammar)
    host_bitmask: Tensor  # [W, ⌈V/32⌉] int32: the host's fill of it (pinned on CUDA)
    stage0: Stage0 | None = None  # static copies of Stage 0's retained values (hybridspec)
    # a grammar's split verification: the pass's outputs kept for the acceptance (`ResidentDecoder._pass`)
    pass_logits: Tensor | None = None  # [W, V] fp32
    pass_features: Tensor | None = None  # [1, W, F] the drafter's features
    pass_layer0: Tensor | None = None  # [W, k] long: Layer 0's routing of the pass's tokens

    @classmethod
    def allocate(cls, draft_len: int, experts_per_token: int, top: int, vocab: int,
                 device: torch.device) -> "Buffers":
        W, D = draft_len + 1, draft_len
        words = (W, (vocab + 31) // 32)
        long = dict(dtype=torch.long, device=device)
        size = 4 + W + 3 * D + W * experts_per_token
        pinned = device.type == "cuda"
        rows = (W, 1 + 2 * top)
        return cls(anchor=torch.zeros(1, **long), block=torch.zeros(1, W, **long),
                   confidence=torch.zeros(D, device=device), entropy=torch.zeros(D, device=device),
                   w0=torch.zeros(1, **long), w_c=torch.zeros(1, **long), w=torch.zeros(1, **long), remaining=torch.zeros(1, **long),
                   m=torch.ones(1, **long),
                   seed=torch.zeros(1, **long), inv_temperature=torch.ones(1, device=device),
                   top_k=torch.zeros(1, **long), top_p=torch.ones(1, device=device),
                   report=torch.zeros(size, device=device),
                   host_reports=torch.zeros(2, size, pin_memory=pinned),
                   logprobs=torch.zeros(rows, device=device), host_logprobs=torch.zeros(2, *rows, pin_memory=pinned),
                   bitmask=torch.full(words, -1, dtype=torch.int32, device=device),
                   host_bitmask=torch.full(words, -1, dtype=torch.int32, pin_memory=pinned))


@dataclass
class Launched:
    """A round whose device work is enqueued and whose report is on its way to the host."""

    w: int  # its verification length (1 for ar)
    timer: PhaseTimer
    slot: int  # the host copy of the report it fills (`Buffers.host_reports`)


@dataclass
class Report:
    """The host's view of one round, from its report."""

    accepted: int  # A
    tokens: list[int]  # emitted, untruncated: d1 … dA, x_new
    w0: int | None
    w_c: int | None
    w: int
    draft_tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    layer0_experts: list[list[int]] = field(default_factory=list)  # [u][k]: Stage 0's tokens
    logprobs: TokenLogprobs | None = None  # of `tokens`, when the request asks for them


def sampling_mode(sampling: SamplingParams) -> str:
    """The graphs a request's sampling needs: `greedy` (argmax acceptance), `sample` (the
    point-mass rule on the softmax at a temperature), `top_k` (the same after a top-k of at most
    `KERNEL_TOP_K`, with or without top-p) or `filter` (after another top-k / top-p, a sort over
    the vocabulary). The parameters' values live in device buffers, not in graphs."""
    if sampling.greedy:
        return "greedy"
    if not sampling.filtered:
        return "sample"
    return "top_k" if 0 < sampling.top_k <= KERNEL_TOP_K else "filter"


class ResidentDecoder:
    """Decoding rounds whose decisions stay on the device (see the module docstring)."""

    def __init__(self, target: HybridTarget, drafter: DFlashDrafter | None, cache: TargetCache, *,
                 graphs: bool, penalties: PenaltyState):
        self.target, self.drafter, self.cache = target, drafter, cache
        self.penalties = penalties  # the request's token history, which the engine begins (`penalties.py`)
        self.device = cache.key.device
        if graphs and self.device.type != "cuda":
            raise ValueError("CUDA graphs need a CUDA device")
        self.graphs = Graphs() if graphs else None
        self.fused_select = target.backend != "torch"  # Eq. 5 and 6 as one launch (`kernels/select`)
        # acceptance, the report, the anchor and the budget as one launch (`kernels/finish`)
        self.finish_round = finish_reference.finish_round
        if target.backend != "torch":
            from ..kernels.finish.triton import finish_round

            self.finish_round = finish_round
        # sampling's point-mass rule from the logits in one or two launches (`kernels/sampling`)
        self.fused_sampling = target.backend != "torch" and FUSED_SAMPLING
        self.fused_requests = fused_request_ops(target.backend)  # logprob rows, penalties, masks as kernels
        D = drafter.draft_len if drafter is not None else 0
        self.top = min(MAX_TOP_LOGPROBS, target.cfg.vocab_size)  # alternatives the graphs compute
        self.buffers = Buffers.allocate(D, target.cfg.num_experts_per_tok, self.top, target.cfg.vocab_size, self.device)
        self.one = torch.ones(1, dtype=torch.long, device=self.device)
        # (policy name, sampling mode, logprobs, penalties, grammar) → (as prepared, its device copy)
        self.prepared: dict[tuple[str, str, bool, bool, bool], tuple[Policy, Policy]] = {}
        self.captured_with: tuple[int, ...] = ()  # `_outside_buffers()` when the graphs were captured
        self.policy: Policy | None = None
        self.mode = "greedy"  # `sampling_mode` of the request being decoded (or the graphs being captured)
        self.with_logprobs = False  # whether its rounds compute logprobs (graphs of their own)
        self.with_penalties = False  # whether its rounds apply penalties (graphs of their own)
        self.with_grammar = False  # whether its rounds mask rows by a grammar (graphs of their own)
        self.grammar: GrammarState | None = None  # the request's grammar state (host)
        self.logprobs: int | None = None  # the alternatives per token the request asks for
        self.span = 1  # round tokens a pending commit covers (W, or 1 for ar)
        self._report_slot = 0  # the host copy of the report the next launch fills

    # ------------------------------------------------------------ set-up
    def prepare(self, policy: Policy, sampling: SamplingParams = SamplingParams(), *, logprobs: bool = False,
                grammar: bool = False) -> Policy:
        """The policy's device copy; with graphs, capture every graph it can launch for this kind
        of sampling (`sampling_mode`), with logprobs or without, with penalties or without, with a
        grammar or without (run once before the first such request: the warm-ups overwrite the
        caches)."""
        key = (policy.name, sampling_mode(sampling), logprobs, sampling.penalized, grammar)
        if self.prepared and self._outside_buffers() != self.captured_with:
            self._forget_graphs()  # a larger cache elsewhere moved tables the graphs read
        if key in self.prepared and self.prepared[key][0] is policy:
            return self.prepared[key][1]
        on_device = policy.to(self.device)
        if isinstance(policy, HybridSpecPolicy) and self.buffers.stage0 is None:
            self.buffers.stage0 = self._stage0_buffers(policy.max_length)
        if grammar and self.buffers.pass_logits is None:
            self._pass_buffers()
        if self.graphs is not None:
            self._capture_all(on_device, key[1:])
        self.prepared[key] = (policy, on_device)
        return on_device

    def _outside_buffers(self) -> tuple[int, ...]:
        """The addresses of what the graphs read that the target and the drafter reallocate when a
        larger cache comes: the target's RoPE tables, the drafter's context cache and its tables."""
        tensors = list(self.target.rope_tables or ())
        if self.drafter is not None:
            tensors += [self.drafter.ctx_k, self.drafter.ctx_v, self.drafter.position, *(self.drafter.rope or ())]
        return tuple(t.data_ptr() for t in tensors if t is not None)

    def _forget_graphs(self) -> None:
        self.prepared.clear()
        if self.graphs is not None:
            self.graphs.forget()

    def begin(self, policy: Policy, anchor: int, remaining: int, sampling: SamplingParams = SamplingParams(),
              logprobs: int | None = None, grammar: GrammarState | None = None) -> None:
        """Switch a prefilled request to resident rounds: positions, budget and sampling parameters
        on the device, the pending commit flushed and replaced by a null one over the round span.
        `logprobs`: the alternatives per token the request asks for (None: no logprobs); `grammar`:
        the state its output is held to, past the prefill's token."""
        key = (policy.name, sampling_mode(sampling), logprobs is not None, sampling.penalized, grammar is not None)
        if self.prepared.get(key, (None,))[0] is not policy:
            what = (f"{key[1]} decoding{' with logprobs' if key[2] else ''}{' with penalties' if key[3] else ''}"
                    f"{' with a grammar' if key[4] else ''}")
            raise RuntimeError(f"policy {policy.name!r} was not prepared for {what} before its request's prefill")
        self.policy = self.prepared[key][1]
        self.mode, self.with_logprobs, self.with_penalties, self.with_grammar = key[1:]
        self.logprobs, self.grammar = logprobs, grammar
        self.span = 1 if not policy.speculative else policy.max_length
        self._enter_static(self.span)
        buf = self.buffers
        buf.anchor.fill_(anchor)
        buf.remaining.fill_(remaining)
        if not policy.speculative:
            buf.report[:4].fill_(1)  # an `ar` round's m, w0, w_c and w (`_step` writes its token)
        if not sampling.greedy:
            buf.seed.fill_(sampling.seed)
            buf.inv_temperature.fill_(1.0 / sampling.temperature)
            buf.top_k.fill_(sampling.top_k)
            buf.top_p.fill_(sampling.top_p)

    def _stage0_buffers(self, W: int) -> Stage0:
        """Static copies of what Stage 0 retains for a block of W tokens ([1, W, ...])."""
        cfg, dtype = self.target.cfg, self.target.embed_tokens.weight.dtype
        hidden = torch.zeros(1, W, cfg.hidden_size, dtype=dtype, device=self.device)
        k = cfg.num_experts_per_tok
        return Stage0(W, hidden, torch.zeros_like(hidden), torch.zeros(1, W, k, dtype=torch.long, device=self.device),
                      torch.zeros(1, W, k, dtype=dtype, device=self.device))

    def _pass_buffers(self) -> None:
        """The static outputs of a grammar's verification pass (`_pass`)."""
        buf, cfg = self.buffers, self.target.cfg
        W = buf.block.shape[1]
        buf.pass_logits = torch.zeros(W, cfg.vocab_size, device=self.device)
        width = cfg.hidden_size * len(self.target.feature_layers)
        buf.pass_features = torch.zeros(1, W, width, dtype=self.target.embed_tokens.weight.dtype, device=self.device)
        buf.pass_layer0 = torch.zeros(W, cfg.num_experts_per_tok, dtype=torch.long, device=self.device)

    def _enter_static(self, span: int) -> None:
        self.target.enter_static(self.cache, span)
        if self.drafter is not None and self.drafter.ctx_k is not None:
            self.drafter.key_span = self.drafter.ctx_k.shape[2]

    # ------------------------------------------------------------ one round
    def launch(self, remaining: int) -> "Launched":
        """Enqueue one round and the copy of its report to the host; nothing waits for the device
        but a nominal policy's read of w. `remaining`: the output budget, or a lower bound of it
        that gives a fixed policy the same length (it chooses that length near the end of the
        output without a read)."""
        policy, timer = self.policy, PhaseTimer(self.device)
        if not policy.speculative and self.grammar is not None:  # the row is filled while the pass runs
            self._launch(("pass", 1), self._step_pass, commits=False)
            self._masks(None, 1)
            self._launch(("accept", 1), self._step_accept)
            timer.mark("step")
            w = 1
        elif not policy.speculative:
            self._launch(("step",), self._step)
            timer.mark("step")
            w = 1
        elif isinstance(policy, FixedPolicy) and self.grammar is None:
            w = max(2, min(remaining, policy.length))
            self._launch(("round", w), lambda: self._round_fixed(w))
            timer.mark("round")
        elif isinstance(policy, FixedPolicy):  # the drafts go to the host for the grammar's rows
            w = max(2, min(remaining, policy.length))
            self._launch(("draft",), self._draft_fixed, commits=False)
            timer.mark("draft")
            self._verify_under_grammar(w)
            timer.mark("verify")
        else:
            self._launch(("select",), self._select, commits=False)
            timer.mark("select")
            phase = "resume" if policy.corrects_routing else "verify"
            if self.grammar is not None:  # one read: w and the drafts the grammar's rows follow
                head = torch.cat((self.buffers.w, self.buffers.block[0, 1:])).tolist()
                w = int(head[0])
                self._verify_under_grammar(w, [int(x) for x in head[1:w]])
            else:
                w = int(self.buffers.w)  # the round's one read besides its report
                self._launch((phase, w), lambda: self._finish(w))
            timer.mark(phase)
        slot, self._report_slot = self._report_slot, 1 - self._report_slot
        self.buffers.host_reports[slot].copy_(self.buffers.report, non_blocking=True)
        if self.with_logprobs:
            self.buffers.host_logprobs[slot].copy_(self.buffers.logprobs, non_blocking=True)
        timer.close()
        return Launched(w, timer, slot)

    def next_round_certain(self, launched: "Launched", remaining: int) -> bool:
        """Whether the round after `launched` (launched with budget `remaining`) runs, with the
        length it gets once the report is read, whatever `launched` emits short of EOS: the
        budget past its w tokens covers one more token, and a fixed policy's whole length. Such a
        round can be launched before `launched` is collected, with budget `remaining − w`."""
        if self.grammar is not None:  # the next round's rows follow the grammar past this round's tokens
            return False
        need = self.policy.length if isinstance(self.policy, FixedPolicy) else 1
        return remaining - launched.w >= need

    def _verify_under_grammar(self, w: int, drafts: list[int] | None = None) -> None:
        """Launch the pass, fill the grammar's rows after `drafts` (d_1 … d_{w−1}; read here when not
        given) while it runs, then launch the acceptance and commit behind the copy of the rows."""
        drafts = self.buffers.block[0, 1:w].tolist() if drafts is None else drafts
        self._launch(("pass", w), lambda: self._pass(w), commits=False)
        self._masks(drafts, w)
        self._launch(("accept", w), lambda: self._accept_pass(w))

    def _masks(self, drafts: list[int] | None, w: int) -> None:
        """The grammar's bitmasks of a pass's w rows (row i after drafts d_1 … d_i) into the buffer
        the acceptance reads, through its pinned host copy (the copy is enqueued after the pass and
        before the acceptance)."""
        buf = self.buffers
        buf.host_bitmask[:w].copy_(self.grammar.rows(drafts, w))
        buf.bitmask[:w].copy_(buf.host_bitmask[:w], non_blocking=True)

    def _launch(self, key: tuple, run: Callable[[], None], *, commits: bool = True) -> None:
        """Run a phase eagerly, or replay its graph and then do on the host what running it would
        have done there (the graph holds only the device work)."""
        if self.graphs is None:
            run()
            return
        self.graphs.replay((self.policy.name, *self._flavour(), *key, self.cache.slot))
        if commits:
            self.cache.flip(self.span)  # the host half of the commit: the next pass writes the other slot
        elif key[0] == "pass":
            self.cache.mark_committed()  # a grammar's pass folded every layer's pending commit
        elif isinstance(self.policy, HybridSpecPolicy):
            self.cache.mark_committed(0)  # Stage 0 folded Layer 0's pending commit

    def _flavour(self) -> tuple[str, bool, bool, bool]:
        """What beside the policy and the phase selects a graph: sampling mode, logprobs, penalties,
        grammar."""
        return self.mode, self.with_logprobs, self.with_penalties, self.with_grammar

    # ------------------------------------------------------------ device work (captured)
    def _logits(self, logits: Tensor, drafts: Tensor) -> Tensor:
        """A pass's logits [w, V] as acceptance reads them: under the request's grammar and
        penalties (row i after drafts d_1 … d_i), or as they are."""
        if self.with_grammar:
            logits = masked(logits, self.buffers.bitmask[: logits.shape[0]], self.fused_requests)
        if not self.with_penalties:
            return logits
        return penalized(logits, drafts, self.penalties, self.fused_requests)

    def _accept(self, drafts: Tensor, logits: Tensor) -> tuple[Tensor, Tensor]:
        """drafts [w−1], logits [w, V] of the pass → (A [1], x_new [1]) of a sampled request: the
        point-mass rule with the request's keyed draws (row 0 decides the token at position + 1;
        called before the commit advances the position). Greedy rounds take the argmax instead."""
        buf = self.buffers
        start = self.cache.position[:1] + 1
        if self.mode == "sample" and self.fused_sampling:
            from ..kernels.sampling.triton import point_mass_from_logits

            return point_mass_from_logits(drafts, logits, buf.inv_temperature, buf.seed, start)
        if self.mode == "top_k" and self.fused_sampling:
            from ..kernels.sampling.filtered import point_mass_filtered

            return point_mass_filtered(drafts, logits, buf.inv_temperature, buf.top_k, buf.top_p, buf.seed, start)
        probs = sampling_probs(logits, buf.inv_temperature, buf.top_k, buf.top_p, self.mode != "sample")
        return point_mass(drafts, probs, buf.seed, start)

    def _step(self) -> None:
        """ar: one token through the target, its argmax (or sample) the next anchor and the report's
        token; the report's (m, w0, w_c, w) = 1 are `begin`'s, and no budget is kept on the device
        (nothing of `ar` reads it)."""
        out = self.target.forward_pass(self.buffers.anchor.view(1, 1), self.cache, features=False)
        self._step_tail(out.logits[0, :1])

    def _step_pass(self) -> None:
        """ar under a grammar: the pass alone, its logits kept for `_step_accept`."""
        out = self.target.forward_pass(self.buffers.anchor.view(1, 1), self.cache, features=False)
        self.buffers.pass_logits[:1].copy_(out.logits[0, :1])

    def _step_accept(self) -> None:
        self._step_tail(self.buffers.pass_logits[:1])

    def _step_tail(self, raw: Tensor) -> None:
        """ar's choice from the pass's logits raw [1, V], its commit and report."""
        buf = self.buffers
        logits = self._logits(raw, buf.block[0, :0])  # [1, V]
        if self.mode == "greedy":
            torch.argmax(logits[0], dim=0, keepdim=True, out=buf.anchor)
        else:
            buf.anchor.copy_(self._accept(buf.block[0, :0], logits)[1])
        self.target.commit(self.cache, 1, self.one)
        buf.report[4:5].copy_(buf.anchor)
        if self.with_penalties:
            self.penalties.record(buf.anchor)
        if self.with_logprobs:
            logprob_rows(raw, buf.anchor, self.top, self.fused_requests, out=buf.logprobs[:1])

    def _draft(self) -> None:
        buf = self.buffers
        draft = self.drafter.propose(buf.anchor)
        buf.block.copy_(torch.cat((buf.anchor, draft.tokens)).view(1, -1))
        buf.confidence.copy_(draft.confidence)
        buf.entropy.copy_(draft.entropy)

    def _w_rem(self) -> Tensor:
        """The longest length the output budget allows, at least 2 (0-d long)."""
        return self.buffers.remaining[0].clamp(2, self.policy.max_length)

    def _select(self) -> None:
        """Draft, Eq. 5, and for hybridspec Stage 0 over the whole block and Eq. 6 (on the triton
        backend Eq. 5 and 6 are one launch, `kernels/select`)."""
        buf, policy = self.buffers, self.policy
        self._draft()
        if self.fused_select and isinstance(policy, NominalPolicy):
            layer0 = None
            if isinstance(policy, HybridSpecPolicy):
                self._stage0()
                layer0 = buf.stage0.expert_ids[0]
            policy.select_fused(buf.confidence, buf.entropy, self._w_rem().view(1), (buf.w0, buf.w_c, buf.w), layer0)
            return
        w0, p_hat = policy.nominal_length(buf.confidence, buf.entropy)
        w_rem = self._w_rem()
        w_c = w0
        if isinstance(policy, HybridSpecPolicy):
            self._stage0()
            w_c = policy.corrected_length(w0, p_hat, buf.stage0.expert_ids[0], w_rem, self.target.cfg.num_experts)
        buf.w0.copy_(w0.view(1))
        buf.w_c.copy_(w_c.view(1))
        buf.w.copy_(torch.minimum(w_c, w_rem).view(1))

    def _stage0(self) -> None:
        """Stage 0 over the whole block, its retained values copied into the static buffers."""
        buf = self.buffers
        if buf.stage0 is None:
            raise RuntimeError("stage-0 buffers missing")
        s0 = self.target.stage0(buf.block, self.cache)
        for name in ("residual", "moe_input", "expert_ids", "expert_weights"):
            getattr(buf.stage0, name).copy_(getattr(s0, name))

    def _round_fixed(self, w: int) -> None:
        self._draft_fixed()
        self.buffers.w.fill_(w)
        self._finish(w)

    def _draft_fixed(self) -> None:
        """A fixed policy's draft and nominal lengths (its w is the launch's)."""
        self._draft()
        for length in (self.buffers.w0, self.buffers.w_c):
            length.fill_(self.policy.length)

    def _finish(self, w: int) -> None:
        """Target pass of w tokens (Stage 1 after a Stage 0 in `_select`, or both stages), acceptance
        (greedy, or the point-mass rule of a sampled request), commit of m = A + 1 tokens, the drafter's context, the report."""
        out, layer0 = self._verification(w)
        self._conclude(w, out.logits[0], out.features, layer0)

    def _verification(self, w: int) -> tuple:
        """The target pass of w tokens (Stage 1 after a Stage 0 in `_select`, or both stages) and
        Layer 0's routing for the report ([W, k] after a whole-block Stage 0, else [w, k])."""
        buf, target, cache = self.buffers, self.target, self.cache
        if isinstance(self.policy, HybridSpecPolicy):
            return target.stage1(buf.stage0, w, cache), buf.stage0.expert_ids[0]
        s0 = target.stage0(buf.block[:, :w], cache)  # forward_pass's two stages, Stage 0's routing kept
        return target.stage1(s0, w, cache), s0.expert_ids[0]

    def _pass(self, w: int) -> None:
        """A grammar's verification pass: its logits, features and Layer 0's routing into the static
        buffers that `_accept_pass` reads."""
        buf = self.buffers
        out, layer0 = self._verification(w)
        buf.pass_logits[:w].copy_(out.logits[0])
        buf.pass_features[:, :w].copy_(out.features)
        buf.pass_layer0[: layer0.shape[0]].copy_(layer0)

    def _accept_pass(self, w: int) -> None:
        """A grammar's acceptance and commit from the pass's buffers (a fixed policy's w written into
        the report here: its draft phase does not know it)."""
        buf = self.buffers
        if isinstance(self.policy, FixedPolicy):
            buf.w.fill_(w)
        rows = buf.block.shape[1] if isinstance(self.policy, HybridSpecPolicy) else w
        self._conclude(w, buf.pass_logits[:w], buf.pass_features[:, :w], buf.pass_layer0[:rows])

    def _conclude(self, w: int, raw: Tensor, features: Tensor, layer0: Tensor) -> None:
        """Acceptance from the pass's logits raw [w, V] (greedy, or the point-mass rule of a sampled
        request), the report, commit of m = A + 1 tokens, the drafter's context."""
        buf, target, cache = self.buffers, self.target, self.cache
        drafts = buf.block[0, 1:]  # [D]
        logits = self._logits(raw, drafts)  # [w, V]
        if self.mode == "greedy":
            y, accepted, x_new = torch.argmax(logits, dim=-1), None, None  # y [w]
        else:
            y, (accepted, x_new) = None, self._accept(drafts[: w - 1], logits)
        # m = A + 1, the report, the next anchor and the budget
        self.finish_round(drafts, w, y, accepted, x_new, (buf.w0, buf.w_c, buf.w), buf.confidence, buf.entropy,
                          layer0, buf.report, buf.anchor, buf.remaining, buf.m)
        if self.with_logprobs:  # rows past m decided nothing emitted; the host reads the first m
            logprob_rows(raw, buf.report[4 : 4 + w].long(), self.top, self.fused_requests,
                         out=buf.logprobs[:w])
        if self.with_penalties:
            self.penalties.record(buf.report[4 : 4 + w].long(), buf.m)
        target.commit(cache, w, buf.m)
        self.drafter.extend(features, buf.m)

    # ------------------------------------------------------------ host side
    def collect(self, launched: "Launched") -> Report:
        """Wait for a launched round's report (the round's one synchronisation) and advance the
        host's lengths by its m."""
        timer = launched.timer
        timer.finish()
        values = self.buffers.host_reports[launched.slot].tolist()
        m = int(values[0])
        if self.grammar is not None:
            self.grammar.accept([int(x) for x in values[4 : 4 + m]])
        self.cache.length += m
        if self.drafter is not None and self.policy.speculative:
            self.drafter.length += m
        logprobs = None
        if self.logprobs is not None:
            logprobs = from_rows(self.buffers.host_logprobs[launched.slot, :m].tolist(), self.logprobs)
        if not self.policy.speculative:
            return Report(0, [int(values[4])], None, None, 1, seconds=timer.seconds, logprobs=logprobs)
        W, D = self.policy.max_length, self.drafter.draft_len
        tokens = [int(x) for x in values[4 : 4 + m]]
        rest = values[4 + W :]
        k = self.target.cfg.num_experts_per_tok
        ids = [int(x) for x in rest[3 * D : 3 * D + W * k]]
        layer0 = [row for row in (ids[i : i + k] for i in range(0, W * k, k)) if row[0] >= 0]
        return Report(m - 1, tokens, int(values[1]), int(values[2]), int(values[3]), [int(x) for x in rest[:D]],
                      rest[D : 2 * D], rest[2 * D : 3 * D], timer.seconds, layer0, logprobs)

    def _capture_all(self, policy: Policy, flavour: tuple[str, bool, bool, bool]) -> None:
        """Capture every graph `launch` can replay for this policy and flavour (`_flavour`), for both
        factor slots, each in the host state the round reaches it in (every GDN layer waiting for a
        commit; Layer 0's already folded by Stage 0 before a `resume`; none after a grammar's pass)."""
        cache, drafter, buf = self.cache, self.drafter, self.buffers
        previous, self.policy = self.policy, policy
        previous_flavour = self._flavour()
        self.mode, self.with_logprobs, self.with_penalties, self.with_grammar = flavour
        self.span = 1 if not policy.speculative else policy.max_length
        # (key, phase, host state it starts in: every GDN layer waiting for a commit ("round"), all but
        # Layer 0, which Stage 0 folded ("after_stage0"), or none, after a grammar's pass ("after_pass"))
        if not policy.speculative and self.with_grammar:
            plan = [(("pass", 1), self._step_pass, "round"), (("accept", 1), self._step_accept, "after_pass")]
        elif not policy.speculative:
            plan = [(("step",), self._step, "round")]
        elif isinstance(policy, FixedPolicy) and not self.with_grammar:
            plan = [(("round", w), lambda w=w: self._round_fixed(w), "round") for w in range(2, policy.length + 1)]
        else:
            fixed = isinstance(policy, FixedPolicy)
            plan = [(("draft",), self._draft_fixed, "round")] if fixed else [(("select",), self._select, "round")]
            start = "after_stage0" if policy.corrects_routing else "round"
            phase = "resume" if policy.corrects_routing else "verify"
            for w in range(2, (policy.length if fixed else policy.max_length) + 1):
                if self.with_grammar:
                    plan += [(("pass", w), lambda w=w: self._pass(w), start),
                             (("accept", w), lambda w=w: self._accept_pass(w), "after_pass")]
                else:
                    plan += [((phase, w), lambda w=w: self._finish(w), start)]
        cache.reset()
        if drafter is not None:  # its context cache exists before any capture, `ar`'s included
            drafter.reset(cache.max_len)
        if self._outside_buffers() != self.captured_with:
            self._forget_graphs()
            self.captured_with = self._outside_buffers()
        self._enter_static(self.span)
        for slot in (0, 1):
            for key, run, state in plan:
                def restore(slot=slot, state=state):
                    """The round's host state at this phase, positions and budget back at the start."""
                    cache.slot, cache.pending_tokens = slot, self.span
                    cache.pending = [state == "round" or (state == "after_stage0" and layer > 0)
                                     for layer in range(len(cache.pending))]
                    cache.position.zero_()
                    if drafter is not None and drafter.position is not None:
                        drafter.position.zero_()
                    buf.remaining.fill_(policy.max_length)

                restore()
                # keyed by policy too: policies share phase names ("select", "verify") but not code
                self.graphs.capture((policy.name, *flavour, *key, slot), run, restore)
        cache.reset()
        self.policy = previous
        self.mode, self.with_logprobs, self.with_penalties, self.with_grammar = previous_flavour
