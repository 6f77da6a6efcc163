"""GPU-resident rounds (CUDA graphs) against the host-driven rounds, on a CUDA machine.

Correctness first, then timing, for the embedded pair (fp32) and a random-weight preset (bf16):

1. exactness: the graph path emits the tokens of its eager run (`graphs=False`) for every policy,
   and, on the embedded pair in fp32, the tokens of `ar` on the host path;
2. per policy and path (`graph`: resident rounds as CUDA graphs; `eager`: the host-driven rounds):
   ms per round and per emitted token over one request; then, in a second pass after every timed
   row (a profiler session may slow what is timed after it), host synchronisations and host
   launches per round and the GPU work per round (operations, their time, by family, the longest
   kernels named) from a profiler trace of a few rounds;
3. one verification pass of w tokens (the target alone, as a graph, after a prefill of the
   context) against its floor: the bytes it must read (the weights of every layer except the
   experts no token routes to, the distinct experts' weights, the KV cache up to the context, the
   GDN states read and written, the LM head) over the device copy bandwidth of the same run
   (random tokens, so random routing), and a `full` round at w = W against the floor of a pass
   with the routing decoding rounds actually had (recorded on the host path: the drafter's tokens
   may share experts) plus a drafter pass's (its weights, the LM head its draft logits go through,
   its context KV); both rows carry the distinct experts per MoE layer;
4. (`--profile`) where one verification pass spends its GPU time: kernel time from the profiler of
   an eager pass (the graph replays the same kernels), split into GDN, MoE (routing, experts),
   softmax attention, dense GEMMs and other, with the longest kernels named.

`--variants a,b` runs steps 1–4 for each variant on the same loaded model (rows and checks tagged
`variant`): `shipped`, an op family put back on its PyTorch reference or its previous form, a
switch turned off, or a form on trial (`VARIANTS`: `two-step-topk`, `prepare-ref`, `no-pdl`,
`torch-sampling`, `torch-request-ops`, `library-linear`, `moe-tiles`, `router-tiles`, `library-head`,
`gdn-v8w1`, `gdn-state-after-wait`; `a+b` both at once), or a step taken
out of the captured passes to bound what removing it could save (`free-norms`, `free-post-norms`,
`free-gated-norm`, `free-conv`, `free-router`, `free-experts`, `free-projections`, `free-attention`,
`free-gdn-verify`, `free-head`; only their verification rows mean anything), to measure a kernel or a launch mode
against what it replaced side by side in one process. `--capacity N` sizes the engines' caches (and
the verification rows' cache) for N tokens instead of the context and four times `--tokens`: a
server's context limit far above the context.
`--flavours plain,logprobs,penalties,logprobs+penalties,grammar` adds graph-path rows per request kind
(logprobs, penalties and a grammar run resident graphs of their own) for each policy.
`--tp N --layouts columns,experts` loads each model once per MoE layout (every expert's columns
split across the ranks, or expert parallelism) and runs everything on each (rows and checks tagged
`layout`).

    python3 bench/gpu_round.py --out DIR [--models embedded,qwen3.6-35b-a3b] [--context 1024]
    python3 bench/gpu_round.py --out DIR --models qwen3.5-122b-a10b --tp 2   # two GPUs, each rank its half
    python3 bench/gpu_round.py --out DIR --models qwen3.5-122b-a10b --tp 2 --layouts columns,experts

Writes DIR/gpu_round.json ({"device", "date", "versions", "rows": [...]}) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import hashlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernels.cuda_timing import copy_bandwidth, median_us  # noqa: E402
from hybridspec.kernels import pdl  # noqa: E402
from hybridspec.kernels.attention import reference as attention_reference  # noqa: E402
from hybridspec.kernels.gdn.tuning import SHIPPED as GDN_SHIPPED  # noqa: E402
from hybridspec.kernels.gdn.tuning import VerifyTuning  # noqa: E402
from hybridspec.kernels.moe import router as moe_router  # noqa: E402
from hybridspec.kernels.moe import triton as moe_triton  # noqa: E402
from hybridspec.kernels.moe.tuning import MoETuning  # noqa: E402
from hybridspec.runtime import resident  # noqa: E402
from hybridspec.runtime.engine import Engine, RoundRecord  # noqa: E402
from hybridspec.runtime.layers.attention import GatedAttention  # noqa: E402
from hybridspec.runtime.layers.gdn import GatedDeltaNet  # noqa: E402
from hybridspec.runtime.layers.moe import Router, SparseMoE  # noqa: E402
from hybridspec.runtime.layers.norms import GatedRMSNorm, OffsetRMSNorm  # noqa: E402
from hybridspec.runtime.backends import gdn_ops  # noqa: E402
from hybridspec.runtime.models.hybrid import HybridTarget  # noqa: E402
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.sampling import SamplingParams  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from tests.runtime.helpers import policy_parameters, prefilled_cache  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCH_CALLS = ("cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC",
                "cudaMemcpyAsync", "cudaMemsetAsync")


REPLAY = object()  # a variant's value: each module's own op wrapped by `replayed`


def replayed(op):
    """`op` as before outside CUDA-graph capture; while a graph is captured, what the same module's op
    returned last for the same input shape, with no launch. A pass timed with every module of a kind
    so wrapped lacks that step's work and launches: the most that fusing the step away could save.
    (Its values are the eager warm-up's, so only timings mean anything.)"""
    outputs = {}

    def call(x, *args, **kwargs):
        key = (tuple(x.shape), len(args), tuple(sorted(k for k, v in kwargs.items() if v is not None)))
        if torch.cuda.is_current_stream_capturing():
            return outputs[key]
        outputs[key] = out = op(x, *args, **kwargs)
        return out

    return call


def gdn_verify_with(block_v: int, warps: int, lengths=(1, 2)):
    """The model's GDN verification (`runtime/backends.gdn_ops`) with the recurrent kernel's programs of
    block_v value rows and `warps` warps at the given lengths, the shipped table elsewhere."""
    tuning = GDN_SHIPPED.replace(verify={t: VerifyTuning("recurrent", block_v, warps) for t in lengths})
    return gdn_ops("triton", tuning)[0]


def gdn_verify_state_after_wait():
    """The model's GDN verification with the shipped launches, each reading its state after its PDL wait."""
    tuning = GDN_SHIPPED.replace(verify={t: dataclasses.replace(v, early_state=False)
                                         for t, v in GDN_SHIPPED.verify.items()})
    return gdn_ops("triton", tuning)[0]


# variant → {module class or name: {attribute: op}} set on every such module of the target (`owners_of`;
# REPLAY: its own op wrapped by `replayed`), or {python module: {attribute: value}} set on that module
VARIANTS = {
    "shipped": {},
    "two-step-topk": {moe_router: {"ROUTER_TILES": moe_router.ROUTER_TILES.replace(packed_rows=0)}},
    # the router of one or two tokens by the tile form, not the register-slice one
    "router-tiles": {moe_router: {"ROUTER_TILES": moe_router.ROUTER_TILES.replace(rows_tokens=0)}},
    "prepare-ref": {GatedAttention: {"prepare_op": attention_reference.norm_rope_store}},
    "no-pdl": {pdl: {"ENABLED": False}},  # the kernels of `kernels/pdl.py` launched without PDL
    "torch-sampling": {resident: {"FUSED_SAMPLING": False}},  # the point-mass rule's torch form
    "torch-request-ops": {resident: {"FUSED_REQUEST_OPS": False}},  # logprob rows, penalties, grammar masks in torch ops
    # the mixers' projections of one or two tokens by the library product, not `kernels/linear`'s
    "library-linear": {GatedDeltaNet: {"linear_op": F.linear}, GatedAttention: {"linear_op": F.linear}},
    # the experts of one or two tokens by the tile kernels, not the register-slice ones
    "moe-tiles": {moe_triton: {"MOE_TUNING": MappingProxyType({64: MoETuning()})}},
    # the GDN recurrent verification of one or two tokens by programs of 8 value rows (shipped: 4), one warp
    "gdn-v8w1": {GatedDeltaNet: {"_verify": gdn_verify_with(8, 1)}},
    # the GDN verification with its state rows and pending factors read after its PDL wait (shipped: before)
    "gdn-state-after-wait": {GatedDeltaNet: {"_verify": gdn_verify_state_after_wait()}},
    # bounds: one step of every layer taken out of the captured passes (`replayed`), its launches and work gone
    # the input, post-attention and final RMS norms (a MoE block's post-attention norm of one or two tokens
    # runs inside its router's launch: `free-router`)
    "free-norms": {OffsetRMSNorm: {"op": REPLAY}},
    "free-post-norms": {"post_attention_layernorm": {"op": REPLAY}},  # the norms before the MLP blocks alone
    "free-gated-norm": {GatedRMSNorm: {"op": REPLAY}},  # the GDN output's gated norm
    "free-conv": {GatedDeltaNet: {"conv_op": REPLAY}},  # the GDN conv + SiLU
    # the router (logits, softmax, top-k); at one or two tokens with the post-attention norm inside its launch
    "free-router": {Router: {"op": REPLAY}, SparseMoE: {"norm_route_op": REPLAY}},
    "free-experts": {SparseMoE: {"experts_op": REPLAY}},  # the routed and shared experts' launches
    "free-projections": {GatedDeltaNet: {"linear_op": REPLAY}, GatedAttention: {"linear_op": REPLAY}},
    "free-attention": {GatedAttention: {"op": REPLAY, "prepare_op": REPLAY}},  # q/k norms, RoPE, cache, attention
    "free-gdn-verify": {GatedDeltaNet: {"_verify": REPLAY}},  # the GDN recurrent step (its fold included)
    "free-head": {HybridTarget: {"head_op": REPLAY}},  # the LM head's product (its cast and the argmax stay)
    # the LM head's product of one or two tokens by the library, not `kernels/linear`'s register-slice rows
    "library-head": {HybridTarget: {"head_op": F.linear}},
}


def owners_of(target, key) -> list:
    """The objects a variant's key names: every module of the target of a class, every module a
    string names (the last part of its qualified name, e.g. `post_attention_layernorm`), or the
    python module itself."""
    if isinstance(key, type):
        return [m for m in target.modules() if isinstance(m, key)]
    if isinstance(key, str):
        return [m for name, m in target.named_modules() if name.rsplit(".", 1)[-1] == key]
    return [key]


def apply_variant(target, name: str) -> list[tuple]:
    """Set a variant's ops on the target's modules (`a+b`: both variants); returns what to put back,
    in the order to put it back."""
    set_by = {}
    for part in name.split("+"):
        for key, attrs in VARIANTS[part].items():
            for attr in attrs:
                if set_by.setdefault((key, attr), part) != part:  # the later part would silently win
                    raise ValueError(f"variant {name!r}: {set_by[key, attr]!r} and {part!r} both set {attr}")
    undo = []
    for key, attrs in (item for part in name.split("+") for item in VARIANTS[part].items()):
        for owner in owners_of(target, key):
            for attr, value in attrs.items():
                undo.append((owner, attr, getattr(owner, attr)))
                setattr(owner, attr, replayed(getattr(owner, attr)) if value is REPLAY else value)
    return undo[::-1]


def log(line: str) -> None:
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, flush=True)


def engines(session, max_context: int) -> dict[str, Engine]:
    t, d = session.target, session.drafter
    return {"graph": Engine(t, d, max_context=max_context, resident=True, graphs=True),
            "resident_eager": Engine(t, d, max_context=max_context, resident=True, graphs=False),
            "eager": Engine(t, d, max_context=max_context, resident=False)}


def prompts_for(session, model: str, context: int, count: int) -> list[list[int]]:
    if session.codec is not None:
        from hybridspec.workbench.prompts import load_prompts

        path = Path(session.model) / ".." / "prompts.jsonl"
        test = load_prompts(path.resolve(), split="test")
        return [session.codec.encode(p.text) for p in test[:: max(1, len(test) // count)][:count]]
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, session.target.cfg.vocab_size, (context,), generator=gen).tolist() for _ in range(count)]


def exactness(session, model: str, runs: dict[str, Engine], prompts, policies, tokens: int, fp32: bool) -> list[dict]:
    rows = []
    ar = make_policy("ar", session.drafter.draft_len)
    reference = [runs["eager"].generate(p, policy=ar, max_new_tokens=tokens).token_ids for p in prompts] if fp32 else None
    for name in policies:
        policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
        graph = [runs["graph"].generate(p, policy=policy, max_new_tokens=tokens).token_ids for p in prompts]
        eager = [runs["resident_eager"].generate(p, policy=policy, max_new_tokens=tokens).token_ids for p in prompts]
        row = dict(model=model, policy=name, prompts=len(prompts), tokens=tokens, graph_equals_eager=graph == eager,
                   graph_tokens_sha256=hashlib.sha256(json.dumps(graph).encode()).hexdigest()[:16])
        if reference is not None:
            row["graph_equals_ar"] = graph == reference
        rows.append(row)
        log(f"  exactness {model} {name:10s} {row}")
    return rows


def profile_round_counts(engine: Engine, prompt, policy, rounds: int,
                         sampling: SamplingParams = SamplingParams()) -> dict:
    """Over `rounds` rounds (prefill excluded), per round: host synchronisations and host launches,
    and the GPU work the rounds ran (kernels inside the graphs included, and copies and fills):
    operations, their summed time in ms, and that time by family (`family`). A variant that is
    faster in wall time with the same GPU time overlaps work; with less GPU time it runs less."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    steps = engine.stream(prompt, policy=policy, max_new_tokens=4 * rounds + 64, sampling=sampling)
    next(steps)
    next(steps)  # the first round (its begin() work is set-up, not a round)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        done = sum(1 for _, _ in zip(range(rounds), steps))
        torch.cuda.synchronize()
    steps.close()
    counts = {e.key: e.count for e in prof.key_averages()}
    syncs = sum(counts.get(name, 0) for name in SYNC_CALLS) - 1  # the synchronize closing the window
    launches = sum(counts.get(name, 0) for name in LAUNCH_CALLS)
    split = {name: 0.0 for name, _ in FAMILIES} | {"other": 0.0}
    by_kernel: dict[str, list[float]] = {}  # name → [µs, calls]
    operations = 0
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            us = getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
            split[family(event.name)] += us
            entry = by_kernel.setdefault(event.name, [0.0, 0])
            entry[0] += us
            entry[1] += 1
            operations += 1
    top = sorted(by_kernel.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    return dict(host_syncs_per_round=round(syncs / done, 2), host_launches_per_round=round(launches / done, 2),
                gpu_ops_per_round=round(operations / done, 1),
                gpu_ms_per_round=round(sum(split.values()) / done / 1e3, 3),
                gpu_ms_per_round_by_family={k: round(v / done / 1e3, 3) for k, v in split.items()},
                gpu_top_kernels_per_round=[dict(us=round(us / done, 1), calls=round(calls / done, 1),
                                                family=family(name), name=name[:90]) for name, (us, calls) in top])


def decode_rows(session, model: str, runs: dict[str, Engine], prompt, policies, tokens: int, eager_tokens: int,
                sampling: SamplingParams = SamplingParams()) -> list[dict]:
    """Per policy and path: ms per round and per token, mean w (greedy, or sampled with `sampling`:
    the point-mass rule). The host reads and launches per round are `count_rows`' (a later pass)."""
    rows = []
    for name in policies:
        policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
        for path in ("graph", "eager"):
            engine = runs[path]
            t0 = time.perf_counter()
            engine.prepare(policy, sampling)
            prepare_s = time.perf_counter() - t0
            n = tokens if path == "graph" else eager_tokens
            engine.generate(prompt, policy=policy, max_new_tokens=min(n, 8), sampling=sampling)  # compiles what the prefill meets
            result = engine.generate(prompt, policy=policy, max_new_tokens=n, sampling=sampling)
            by_w: dict[int, list[float]] = {}
            for record in result.rounds:
                by_w.setdefault(record.w, []).append(record.seconds["total"])
            row = dict(model=model, path=path, policy=name, temperature=sampling.temperature, top_k=sampling.top_k,
                       top_p=sampling.top_p, rounds=len(result.rounds),
                       ms_per_round=round(result.decode_seconds * 1e3 / max(1, len(result.rounds)), 3),
                       ms_per_token=round(result.decode_seconds * 1e3 / max(1, result.decode_tokens), 3),
                       w=round(result.mean_verification_length, 2),
                       ms_per_round_by_w={w: round(statistics.median(v) * 1e3, 3) for w, v in sorted(by_w.items())},
                       prepare_s=round(prepare_s, 2))
            rows.append(row)
            log(f"  decode {model} {path:6s} {name:10s} {row}")
    return rows


FLAVOURS = {  # name → (sampling, logprobs, grammar): the request kinds whose resident graphs are their own
    "plain": (SamplingParams(), None, False),
    "logprobs": (SamplingParams(), 20, False),
    "penalties": (SamplingParams(presence_penalty=0.5, frequency_penalty=0.5), None, False),
    "logprobs+penalties": (SamplingParams(presence_penalty=0.5, frequency_penalty=0.5), 20, False),
    "grammar": (SamplingParams(), None, True),  # any JSON object (models with a tokenizer)
}


def flavour_grammar(session):
    """A fresh grammar state for the `grammar` flavour: any JSON object."""
    from hybridspec.runtime.grammar import GrammarCompiler, GrammarSpec, GrammarState

    cfg = session.target.cfg
    compiled = GrammarCompiler(session.codec.tokenizer, cfg.vocab_size, session.eos_ids).compile(
        GrammarSpec("json_schema", '{"type": "object"}'))
    return GrammarState(compiled, session.eos_ids, cfg.vocab_size)


def flavour_rows(session, model: str, runs: dict[str, Engine], prompt, policies, tokens: int,
                 flavours: list[str]) -> list[dict]:
    """Per policy and flavour, the graph path's ms per round (also by w) and per token, each
    flavour's graphs captured before it is timed. Logprobs leave the tokens unchanged
    (`same_tokens_as_plain`), so their rows compare round for round; penalties and a grammar change
    the tokens, and so the rounds' lengths: compare those by w. A model without a tokenizer has no
    `grammar` rows."""
    rows = []
    for name in policies:
        policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
        plain = None
        for flavour in flavours:
            sampling, logprobs, grammar = FLAVOURS[flavour]
            if grammar and session.codec is None:
                continue
            engine = runs["graph"]
            states = [flavour_grammar(session) if grammar else None for _ in range(2)]
            engine.generate(prompt, policy=policy, max_new_tokens=8, sampling=sampling, logprobs=logprobs,
                            grammar=states[0], eos_ids=session.eos_ids if grammar else ())
            result = engine.generate(prompt, policy=policy, max_new_tokens=tokens, sampling=sampling,
                                     logprobs=logprobs, grammar=states[1], eos_ids=session.eos_ids if grammar else ())
            plain = result.token_ids if flavour == "plain" else plain
            by_w: dict[int, list[float]] = {}
            for record in result.rounds:
                by_w.setdefault(record.w, []).append(record.seconds["total"])
            row = dict(model=model, path="graph", policy=name, flavour=flavour, rounds=len(result.rounds),
                       ms_per_round=round(result.decode_seconds * 1e3 / max(1, len(result.rounds)), 3),
                       ms_per_token=round(result.decode_seconds * 1e3 / max(1, result.decode_tokens), 3),
                       w=round(result.mean_verification_length, 2),
                       ms_per_round_by_w={w: round(statistics.median(v) * 1e3, 3) for w, v in sorted(by_w.items())},
                       same_tokens_as_plain=None if plain is None else result.token_ids == plain)
            rows.append(row)
            log(f"  flavour {model} {name:10s} {flavour:18s} {row}")
    return rows


def count_rows(session, runs: dict[str, Engine], prompt, policies, sampling: SamplingParams) -> dict[tuple, dict]:
    """(policy, path) → host reads and launches and the GPU work per round under `sampling`
    (`profile_round_counts`)."""
    counts = {}
    for name in policies:
        policy = make_policy(name, session.drafter.draft_len, policy_parameters(session.drafter.draft_len))
        for path in ("graph", "eager"):
            runs[path].prepare(policy, sampling)
            counts[name, path] = profile_round_counts(runs[path], prompt, policy, rounds=4 if path == "eager" else 16,
                                                      sampling=sampling)
            summary = {k: v for k, v in counts[name, path].items() if k != "gpu_top_kernels_per_round"}
            log(f"  counts {name:10s} {path:6s} {summary}")
            if path == "graph":
                for item in counts[name, path]["gpu_top_kernels_per_round"]:
                    log(f"      {item['us']:9.1f} us  x{item['calls']:<6} {item['family']:9s} {item['name']}")
    return counts


def pass_bytes(target, cache, routing: list[torch.Tensor], context: int) -> int:
    """Bytes a verification pass must move: every weight except unrouted experts, the distinct
    experts of each MoE layer, the KV cache up to the context, GDN states read and written. Under
    expert parallelism a layer's distinct experts are those of the rank that holds the most of them
    (the pass waits for it)."""
    total = 0
    for name, p in target.named_parameters():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj") or "embed_tokens" in name:
            continue
        total += p.numel() * p.element_size()
    if target.lm_head.weight is target.embed_tokens.weight:
        total += target.lm_head.weight.numel() * target.lm_head.weight.element_size()
    moes = [layer.mlp for layer in target.layers if layer.is_moe]
    for moe, ids in zip(moes, routing):
        held = moe.experts.gate_up_proj.shape[0]  # experts per rank (all of them but under expert parallelism)
        distinct = int(torch.bincount(ids.unique() // held).max())
        per_expert = (moe.experts.gate_up_proj[0].numel() + moe.experts.down_proj[0].numel()) * moe.experts.down_proj.element_size()
        total += distinct * per_expert
    kv = cache.key[:, :, :context]
    total += 2 * kv.numel() * kv.element_size()
    total += 2 * cache.ssm.numel() * cache.ssm.element_size()
    return total


def drafter_bytes(drafter, context: int) -> int:
    """Bytes a drafter pass must move: its weights, the target's LM head (the draft's logits go
    through it) and its context KV up to the context."""
    total = sum(p.numel() * p.element_size() for p in drafter.parameters())
    head = drafter._target[1].weight
    total += head.numel() * head.element_size()
    if drafter.ctx_k is not None:
        kv = drafter.ctx_k[:, :, :context]
        total += 2 * kv.numel() * kv.element_size()
    return total


def round_routing(engine: Engine, prompt, W: int, rounds: int = 6) -> tuple[list[list[torch.Tensor]], list[list[int]]]:
    """The routing of `rounds` of `full`'s decoding rounds of W tokens (the host path records it):
    per round, each MoE layer's ids [W, k], and the round's W input tokens (its anchor, then the
    drafts). Decoding rounds verify the drafter's tokens, which may route to fewer distinct experts
    than the random block of the verification rows."""
    routings, blocks = [], []
    steps = engine.stream(prompt, policy=make_policy("full", engine.drafter.draft_len),
                          max_new_tokens=(rounds + 1) * W, record_routing=True)
    anchor = None
    for emitted, record in steps:
        if isinstance(record, RoundRecord) and record.w == W and record.expert_ids:
            routings.append(record.expert_ids)
            blocks.append([anchor, *record.draft_tokens[: W - 1]])
            if len(routings) == rounds:
                break
        anchor = emitted[-1]
    steps.close()
    return routings, blocks


def round_trace_rows(model: str, runs: dict[str, Engine], prompt, W: int, tokens: int = 64,
                     floor_of=None) -> list[dict]:
    """Round by round of one `full` decoding of `tokens` tokens: the graph round's event time, its w
    and A, and the distinct experts per MoE layer of its verified block (from the host path's
    routing of the same tokens); with `floor_of` (a round's routing → ms), each round's floor from
    its own routing and the ratio, and a summary row of the rounds at w = W (`round own floor:W`).
    A round's time follows its routing: the drafts of a random-weight decoding route to 15–95
    distinct experts a layer from round to round."""
    policy = make_policy("full", W - 1)
    runs["graph"].generate(prompt, policy=policy, max_new_tokens=8)  # graphs captured, kernels compiled
    graph = runs["graph"].generate(prompt, policy=policy, max_new_tokens=tokens)
    host = runs["eager"].generate(prompt, policy=policy, max_new_tokens=tokens, record_routing=True)
    if graph.token_ids != host.token_ids:
        raise RuntimeError("the graph and host decodings differ: no trace")
    rows = []
    for i, (g, h) in enumerate(zip(graph.rounds, host.rounds)):
        rows.append(dict(model=model, path="graph", policy="trace:full", round=i, w=g.w, accepted=g.accepted,
                         ms_per_round=round(g.seconds["total"] * 1e3, 3), distinct_experts=mean_distinct([h.expert_ids]),
                         distinct_drafts=len(set(h.draft_tokens[: g.w - 1]))))
        if floor_of is not None:
            floor = floor_of(h.expert_ids)
            rows[-1].update(floor_ms=round(floor, 3), ratio=round(rows[-1]["ms_per_round"] / floor, 3))
    head, tail = [r for r in rows if r["w"] == W], [r for r in rows if r["w"] < W]
    for name, part in (("w = W", head), ("tail", tail)):
        if part:
            log(f"  trace {model} full {name:6s} {len(part):3d} rounds  "
                f"{statistics.median(r['ms_per_round'] for r in part):7.3f} ms median  "
                f"{statistics.mean(r['distinct_experts'] for r in part):5.1f} distinct experts per layer"
                + (f"  ×{statistics.median(r['ratio'] for r in part):.2f} median of its own floor" if floor_of else ""))
    if floor_of is not None and head:
        ms, floor = sum(r["ms_per_round"] for r in head), sum(r["floor_ms"] for r in head)
        rows.append(dict(model=model, path="graph", policy=f"round own floor:{W}", w=W, rounds=len(head),
                         ms_per_round=round(ms / len(head), 3), floor_ms=round(floor / len(head), 3),
                         ratio=round(ms / floor, 3), ratio_median=round(statistics.median(r["ratio"] for r in head), 3),
                         ratio_max=max(r["ratio"] for r in head),
                         distinct_experts=round(statistics.mean(r["distinct_experts"] for r in head), 1)))
    return rows


def mean_distinct(routings: list[list[torch.Tensor]]) -> float:
    """Distinct experts per MoE layer, averaged over layers and passes."""
    counts = [int(ids.unique().numel()) for routing in routings for ids in routing]
    return round(sum(counts) / max(1, len(counts)), 1)


def round_floor_rows(session, model: str, rows: list[dict], context: int, bandwidth: float,
                     routings: list[list[torch.Tensor]], cache) -> list[dict]:
    """The floor of a `full` round at w = W (a verification pass's bytes with the rounds' own routing,
    plus a drafter pass's) beside the graph round's median time at w = W from the decode rows; also
    the floor with the random block's routing of the verification rows (`floor_ms_random_block`)."""
    W = session.drafter.draft_len + 1
    verify = next((r for r in rows if r["model"] == model and r["policy"] == f"verify:{W}"), None)
    full = next((r for r in rows if r["model"] == model and r["path"] == "graph" and r["policy"] == "full"), None)
    if verify is None or full is None or W not in full["ms_per_round_by_w"] or not routings:
        return []
    drafter_ms = drafter_bytes(session.drafter, context) / bandwidth * 1e3
    verify_ms = statistics.mean(pass_bytes(session.target, cache, r, context) for r in routings) / bandwidth * 1e3
    floor_ms = verify_ms + drafter_ms
    ms = full["ms_per_round_by_w"][W]
    log(f"  round {model} full w={W} {ms:8.3f} ms  floor {floor_ms:7.3f} ms  ×{ms / floor_ms:.2f}  "
        f"({mean_distinct(routings)} distinct experts per layer; the random block's {verify['distinct_experts']}, "
        f"floor {verify['floor_ms'] + drafter_ms:.3f} ms)")
    return [dict(model=model, path="graph", policy=f"round floor:{W}", w=W, ms_per_round=ms,
                 floor_ms=round(floor_ms, 3), ratio=round(ms / floor_ms, 2), distinct_experts=mean_distinct(routings),
                 passes=len(routings), floor_ms_random_block=round(verify["floor_ms"] + drafter_ms, 3))]


def verification_rows(session, model: str, cache, context: int, widths, bandwidth: float) -> list[dict]:
    """One target pass of w tokens as a CUDA graph over `cache` (a prefill of `context` tokens,
    room for max(widths) per pass), vs its floor."""
    target = session.target
    W = max(widths)
    gen = torch.Generator().manual_seed(1)
    block = torch.randint(0, target.cfg.vocab_size, (1, W), generator=gen).cuda()
    rows = []
    for w in widths:
        us, floor_us, distinct = timed_pass(target, cache, block[:, :w], context, bandwidth)
        rows.append(dict(model=model, path="graph", policy=f"verify:{w}", w=w, ms_per_round=round(us / 1e3, 3),
                         floor_ms=round(floor_us / 1e3, 3), ratio=round(us / floor_us, 2), distinct_experts=distinct))
        log(f"  verify {model} w={w:2d} {us / 1e3:8.3f} ms  floor {floor_us / 1e3:7.3f} ms  ×{us / floor_us:.2f}")
    return rows


def drafted_verification_rows(session, model: str, cache, context: int, blocks: list[list[int]],
                              bandwidth: float) -> list[dict]:
    """The verification pass of W tokens timed on the blocks decoding drafted (`round_routing`) instead
    of a random block, over the same prefilled cache as `verification_rows`: what the `full` round's
    verification costs with the drafts' routing (the round's time less this is the drafter's pass
    and the round's own steps). One row, the mean over the blocks."""
    if not blocks:
        return []
    target = session.target
    W = len(blocks[0])
    timed = [timed_pass(target, cache, torch.tensor([block], device="cuda"), context, bandwidth)
             for block in blocks]
    us, floor_us = statistics.mean(t[0] for t in timed), statistics.mean(t[1] for t in timed)
    distinct = round(statistics.mean(t[2] for t in timed), 1)
    log(f"  verify {model} drafted w={W:2d} {us / 1e3:8.3f} ms  floor {floor_us / 1e3:7.3f} ms  ×{us / floor_us:.2f}  "
        f"({distinct} distinct experts per layer, {len(blocks)} blocks)")
    return [dict(model=model, path="graph", policy=f"verify drafted:{W}", w=W, ms_per_round=round(us / 1e3, 3),
                 floor_ms=round(floor_us / 1e3, 3), ratio=round(us / floor_us, 2), distinct_experts=distinct,
                 passes=len(blocks))]


def timed_pass(target, cache, block: torch.Tensor, context: int, bandwidth: float) -> tuple[float, float, float]:
    """One verification pass of `block` [1, w] captured as a CUDA graph over `cache` (nothing
    committed): (median µs per replay, the floor in µs from its own routing, its distinct experts
    per MoE layer)."""
    routing = target.forward_pass(block, cache, record_routing=True).expert_ids
    cache.pending = [True] * len(cache.pending)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        target.forward_pass(block, cache)
    torch.cuda.current_stream().wait_stream(stream)
    cache.pending = [True] * len(cache.pending)
    with torch.cuda.graph(graph):
        target.forward_pass(block, cache)
    cache.pending = [True] * len(cache.pending)
    us = median_us(graph, 1, samples=7, replays=10)
    del graph
    return us, pass_bytes(target, cache, routing, context) / bandwidth * 1e6, mean_distinct([routing])


FAMILIES = (("gdn", ("gdn_", "conv1d", "conv_")), ("moe", ("_moe_", "_router_", "topk", "sort", "scatter")),
            ("attention", ("flash", "fmha", "attention", "sdpa", "softmax", "_attn_")),
            ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "matmul", "splitk", "split_k")))


TOP_KERNELS = 16  # the kernels of largest GPU time per round that `profile_round_counts` lists


def family(kernel: str) -> str:
    low = kernel.lower()
    return next((name for name, keys in FAMILIES if any(k in low for k in keys)), "other")


def profile_rows(session, model: str, context_prompt, widths) -> list[dict]:
    """GPU kernel time of one eager verification pass of w tokens, by kernel family."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    target = session.target
    device = next(target.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    W = max(widths)
    cache = prefilled_cache(target, context_prompt, W)
    block = torch.randint(0, target.cfg.vocab_size, (1, W), generator=torch.Generator().manual_seed(1)).to(device)
    rows = []
    for w in widths:
        for _ in range(2):  # compile and warm
            cache.pending = [True] * len(cache.pending)
            target.forward_pass(block[:, :w], cache)
        sync()
        reps = 5
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for _ in range(reps):
                cache.pending = [True] * len(cache.pending)
                target.forward_pass(block[:, :w], cache)
            sync()
        kernels: dict[str, list[float]] = {}
        for event in prof.events():
            if event.device_type == DeviceType.CUDA or (device.type == "cpu" and event.name.startswith("aten::")):
                us = (getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)) if device.type == "cuda" \
                    else event.self_cpu_time_total
                kernels.setdefault(event.name, []).append(us)
        split = {name: 0.0 for name, _ in FAMILIES} | {"other": 0.0}
        for name, times in kernels.items():
            split[family(name)] += sum(times) / reps
        top = sorted(((sum(t) / reps, len(t) / reps, n) for n, t in kernels.items()), reverse=True)[:12]
        total = sum(split.values())
        row = dict(model=model, policy=f"profile:{w}", w=w, kernel_us=round(total, 1),
                   split_us={k: round(v, 1) for k, v in split.items()},
                   kernels_per_pass=round(sum(len(t) for t in kernels.values()) / reps, 1),
                   top=[dict(us=round(us, 1), calls=calls, family=family(n), name=n[:90]) for us, calls, n in top])
        rows.append(row)
        log(f"  profile {model} w={w:2d} kernels {total / 1e3:7.3f} ms in {row['kernels_per_pass']} kernels: "
            + "  ".join(f"{k} {v / 1e3:.3f}" for k, v in split.items()))
        for item in row["top"]:
            log(f"      {item['us']:9.1f} us  x{item['calls']:<5} {item['family']:9s} {item['name']}")
        row["gemm_shapes"] = gemm_shapes(prof, reps)
        for item in row["gemm_shapes"]:
            log(f"      {item['us']:9.1f} us  x{item['calls']:<5} {item['op']:10s} {item['shapes']}")
    return rows


def gemm_shapes(prof, reps: int) -> list[dict]:
    """The dense GEMM calls of a profiled pass grouped by operand shapes, the costliest first."""
    rows = []
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key in ("aten::mm", "aten::addmm", "aten::bmm"):
            us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
            rows.append(dict(op=event.key, shapes=str(event.input_shapes), calls=event.count / reps, us=round(us / reps, 1)))
    return sorted(rows, key=lambda r: -r["us"])[:10]


def versions() -> dict:
    import triton

    return dict(python=platform.python_version(), torch=torch.__version__, cuda=str(torch.version.cuda),
                triton=triton.__version__)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="embedded,qwen3.6-35b-a3b")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens of the random-weight preset")
    ap.add_argument("--tokens", type=int, default=64, help="new tokens per request on the graph path")
    ap.add_argument("--capacity", type=int, default=None,
                    help="the engines' context (prompt + generated tokens; default the context and 4 × tokens): "
                         "the KV cache's positions, over which the attention's splits are laid")
    ap.add_argument("--eager-tokens", type=int, default=12, help="new tokens per request on the host path (slow)")
    ap.add_argument("--policies", default="ar,static:4,full,nominal,hybridspec")
    ap.add_argument("--no-exactness", action="store_true")
    ap.add_argument("--no-decode", action="store_true", help="skip the per-policy decode rows")
    ap.add_argument("--profile", action="store_true", help="kernel-time split of one verification pass")
    ap.add_argument("--temperatures", default="0", help="decode rows at each of these temperatures (0: greedy)")
    ap.add_argument("--top-k", type=int, default=0, help="the sampled decode rows' top-k (0: off)")
    ap.add_argument("--top-p", type=float, default=1.0, help="the sampled decode rows' top-p (1: off)")
    ap.add_argument("--no-verification", action="store_true", help="skip the per-length verification rows")
    ap.add_argument("--flavours", default="", help=f"comma list of {', '.join(FLAVOURS)}: graph-path rows per request "
                    "kind (logprobs 20; presence and frequency penalties 0.5), greedy")
    ap.add_argument("--variants", default="shipped", help=f"comma list of {', '.join(VARIANTS)} (a+b: both at once)")
    ap.add_argument("--tp", type=int, default=0, help="tensor-parallel ranks, one GPU each (spawned, or torchrun's); "
                    "1: one rank through the same code (an all-reduce over one GPU); 0: no process group")
    ap.add_argument("--layouts", default="columns", help="with --tp: comma list of the MoE layouts to run one after "
                    "the other, columns (every expert's intermediate columns split) and experts (expert "
                    "parallelism: 1/P of the experts whole per rank)")
    args = ap.parse_args(argv)
    args.layouts = layouts = [v for v in args.layouts.split(",") if v]
    if unknown := [v for v in layouts if v not in ("columns", "experts")]:
        ap.error(f"unknown layout(s) {unknown}: columns, experts")
    if "experts" in layouts and args.tp < 2:
        ap.error("--layouts experts needs --tp 2 or more")
    if unknown := [f for f in args.flavours.split(",") if f and f not in FLAVOURS]:
        ap.error(f"unknown flavour(s) {unknown}: {', '.join(FLAVOURS)}")
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if any(part not in VARIANTS for part in v.split("+"))]:
        ap.error(f"unknown variant(s) {unknown}: {', '.join(VARIANTS)}")
    if args.tp:  # a layout the target cannot take is refused before any rank starts
        from hybridspec.runtime.config import ConfigError
        from hybridspec.runtime.session import check_tensor_parallel

        for model in (m for m in args.models.split(",") if m):
            try:
                for layout in layouts:
                    check_tensor_parallel(None if model == "embedded" else model, args.tp, layout == "experts")
            except ConfigError as exc:
                ap.error(f"--tp {args.tp} with --models {model}: {exc}")
    if not torch.cuda.is_available():
        print("gpu_round.py needs a CUDA GPU", file=sys.stderr)
        return 2
    command = "python3 bench/gpu_round.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.tp:
        from hybridspec.runtime.tensor_parallel import launch

        launch(run, args.tp, "cuda", args, variants, command)
    else:
        run(args, variants, command)
    return 0


def engine_context(args) -> int:
    """The engines' context: `--capacity`, or the prompt and four times the new tokens."""
    return args.capacity or args.context + 4 * args.tokens


def open_model(args, model: str, layout: str, tensor_parallel: bool):
    """(session, prompts) of one model and MoE layout: the embedded pair in fp32, a preset's random
    weights in bf16, on the Triton backend."""
    embedded = model == "embedded"
    t0 = time.perf_counter()
    session = open_session(None if embedded else model, None if embedded else "random", device="cuda",
                           dtype="float32" if embedded else "bfloat16", backend="triton",
                           max_context=engine_context(args), tensor_parallel=tensor_parallel,
                           expert_parallel=layout == "experts")
    log(f"{model} ({layout}): loaded in {time.perf_counter() - t0:.1f} s")
    return session, prompts_for(session, model, args.context, 6 if embedded else 2)


def run(args, variants: list[str], command: str) -> None:
    """Every model and variant of `main`'s arguments; under `--tp` on every rank, rank 0 writes and
    prints (each rank's weights, caches and floor are its own part's: bytes per GPU)."""
    import torch.distributed as dist

    tensor_parallel = dist.is_initialized()
    writer = not tensor_parallel or dist.get_rank() == 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    policies = [p for p in args.policies.split(",") if p]
    result = dict(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(), command=command,
                  versions=versions(), checks=[], rows=[],
                  tensor_parallel=dist.get_world_size() if tensor_parallel else None)
    bandwidth = copy_bandwidth(samples=9)
    result["copy_bandwidth_TBps"] = round(bandwidth / 1e12, 3)
    log(f"{result['device']} {result['versions']} copy {bandwidth / 1e12:.2f} TB/s")
    args.out.mkdir(parents=True, exist_ok=True)
    samplings = [SamplingParams(t, seed=0, **(dict(top_k=args.top_k, top_p=args.top_p) if t > 0 else {}))
                 for t in (float(t) for t in args.temperatures.split(",") if t)]
    loads = [(m, v) for m in args.models.split(",") if m for v in args.layouts]

    def write() -> None:
        if writer:
            (args.out / "gpu_round.json").write_text(json.dumps(result, indent=1))

    # timed pass over every model, layout and variant before any profiler session in the process: a
    # session can leave CUDA's activity tracing attached, and graph replays timed after it would pay
    # for its kernel records
    for model, layout in loads:
        session, prompts = open_model(args, model, layout, tensor_parallel)
        embedded = model == "embedded"
        for variant in variants:
            undo = apply_variant(session.target, variant)
            runs = engines(session, engine_context(args))
            log(f"{model} ({layout}) variant {variant}: timed")
            rows = []
            if not args.no_exactness:  # every variant: a variant's graphs must give its eager tokens too
                result["checks"] += [dict(check, variant=variant, layout=layout) for check in exactness(
                    session, model, runs, prompts if embedded else prompts[:1], policies, 48 if embedded else 16,
                    fp32=embedded)]
            if not args.no_decode:
                for sampling in samplings:
                    rows += decode_rows(session, model, runs, prompts[0], policies, args.tokens, args.eager_tokens,
                                        sampling)
            if flavours := [f for f in args.flavours.split(",") if f]:
                rows += flavour_rows(session, model, runs, prompts[0], policies, args.tokens, flavours)
            if not embedded and not args.no_verification:
                W, widths = session.drafter.draft_len + 1, (1, 2, 4, 8, 12, 16)
                # a prefill of the context in a cache of `capacity` positions (default the context and 2
                # passes), for the random block's widths and the drafted blocks
                cache = prefilled_cache(session.target, prompts[0], max(W, *widths), args.capacity)
                rows += verification_rows(session, model, cache, len(prompts[0]), widths, bandwidth)
                routings, blocks = round_routing(runs["eager"], prompts[0], W)  # the host path records routing
                rows += drafted_verification_rows(session, model, cache, len(prompts[0]), blocks, bandwidth)
                rows += round_floor_rows(session, model, rows, args.context, bandwidth, routings, cache)
                drafter_ms = drafter_bytes(session.drafter, args.context) / bandwidth * 1e3

                def floor_of(routing, cache=cache, target=session.target):  # its verification's bytes and a drafter pass
                    return pass_bytes(target, cache, routing, args.context) / bandwidth * 1e3 + drafter_ms

                rows += round_trace_rows(model, runs, prompts[0], W, floor_of=floor_of)
                del cache, floor_of
            result["rows"] += [dict(row, variant=variant, layout=layout) for row in rows]
            for module, attr, op in undo:
                setattr(module, attr, op)
            del runs
            torch.cuda.empty_cache()
            write()
        del session, undo  # undo names the last variant's modules, and so their weights
        gc.collect()
        torch.cuda.empty_cache()
    # counted pass, under the profiler, once per distinct variant: host reads and launches and the
    # GPU work per round (filled into the timed rows), and `--profile`'s kernel-time split
    for model, layout in loads:
        embedded = model == "embedded"
        profiled = args.profile and not embedded and not args.no_verification
        if args.no_decode and not profiled:
            continue
        session, prompts = open_model(args, model, layout, tensor_parallel)
        for variant in dict.fromkeys(variants):
            undo = apply_variant(session.target, variant)
            runs = engines(session, engine_context(args))
            log(f"{model} ({layout}) variant {variant}: counted")
            for sampling in samplings if not args.no_decode else ():
                counts = count_rows(session, runs, prompts[0], policies, sampling)
                for row in result["rows"]:
                    if (row["model"], row["layout"], row["variant"]) == (model, layout, variant) \
                            and row.get("temperature") == sampling.temperature \
                            and (row["policy"], row.get("path")) in counts:
                        row.update(counts[row["policy"], row["path"]])
            if profiled:
                result["profile"] = result.get("profile", []) + [
                    dict(row, variant=variant, layout=layout)
                    for row in profile_rows(session, model, prompts[0], (1, 8, 16))]
            for module, attr, op in undo:
                setattr(module, attr, op)
            del runs
            torch.cuda.empty_cache()
            write()
        del session, undo  # undo names the last variant's modules, and so their weights
        gc.collect()
        torch.cuda.empty_cache()
    if writer:
        print(json.dumps(result["checks"], indent=1))


if __name__ == "__main__":
    raise SystemExit(main())
