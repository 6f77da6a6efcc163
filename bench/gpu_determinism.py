"""Is the runtime bitwise deterministic on the GPU, and if not, which piece is not?

Each check repeats one computation from the same inputs and counts results that differ bitwise from
the first:

1. the Triton MoE experts of one layer alone (`--calls` times at N = 1, 16 and a prefill piece);
2. a prefill of the prompt into fresh caches, compared tensor by tensor (KV, conv, GDN state);
3. one verification pass of w tokens from the same state, eagerly and as one captured graph
   replayed, every layer's output tapped: the first layer that differs and its kind;
4. whole `ar` decodes on the graph, resident-eager and host paths, each twice;
5. two `ar` requests on fresh engines with every pass traced (layer outputs, logits): the first
   pass and layer where they part.

    python3 bench/gpu_determinism.py [--model qwen3.6-35b-a3b] [--calls 200] [--passes 30]

Prints one JSON object per check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.gpu_round import engines, prompts_for  # noqa: E402
from hybridspec.runtime.engine import Engine  # noqa: E402
from hybridspec.runtime.layers.moe import SparseMoE  # noqa: E402
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from tests.runtime.helpers import captured_pass, pass_outputs, prefilled_cache  # noqa: E402


def show(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def differing(results: list) -> int:
    """How many of results[1:] differ bitwise from results[0] (tensors or tuples of tensors)."""
    def same(a, b):
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        return all(same(x, y) for x, y in zip(a, b))
    return sum(not same(results[0], r) for r in results[1:])


def moe_alone(target, calls: int) -> None:
    moe = next(m for m in target.modules() if isinstance(m, SparseMoE))
    device, dtype = moe.experts.gate_up_proj.device, moe.experts.gate_up_proj.dtype
    gen = torch.Generator(device=device).manual_seed(0)
    for n in (1, 16, 64):
        x = torch.randn(1, n, target.cfg.hidden_size, device=device, dtype=dtype, generator=gen)
        ids, weights = moe.route(x)
        outs = [moe.run_experts(x, ids, weights).clone() for _ in range(calls)]
        show({"check": "moe_alone", "N": n, "calls": calls, "differing": differing(outs)})


def cache_state(cache) -> tuple:
    return tuple(t.clone() for t in (cache.key, cache.value, cache.conv, cache.ssm))


def prefill_twice(target, prompt: list[int], max_context: int) -> None:
    device = next(target.parameters()).device
    states = []
    for _ in range(3):
        engine = Engine(target, None, max_context=max_context, resident=False)
        engine.cache.reset()
        target.prefill(torch.tensor([prompt], device=device), engine.cache)
        target.flush(engine.cache)
        states.append(cache_state(engine.cache))
        del engine
    names = ("key", "value", "conv", "ssm")
    show({"check": "prefill", "runs": len(states),
          "differing": {name: sum(not torch.equal(states[0][i], s[i]) for s in states[1:]) for i, name in enumerate(names)}})


def passes(target, prompt: list[int], w: int, count: int, W: int) -> None:
    device = next(target.parameters()).device
    taps, target.feature_layers = target.feature_layers, tuple(range(len(target.layers)))
    try:
        cache = prefilled_cache(target, prompt, W)
        block = torch.randint(0, target.cfg.vocab_size, (1, w), generator=torch.Generator().manual_seed(w)).to(device)
        eager = [pass_outputs(target, cache, block, graph=False) for _ in range(count)]
        replays = [eager[0]]
        if device.type == "cuda":
            graph, out = captured_pass(target, cache, block)
            replays = []
            for _ in range(count):
                cache.pending = [True] * len(cache.pending)
                graph.replay()
                replays.append((out.features.clone(), out.logits.clone()))
        L, H, kinds = len(target.layers), target.cfg.hidden_size, target.cfg.layer_types

        def first_layer(runs):
            for r in runs[1:]:
                fa, fb = runs[0][0].view(w, L, H), r[0].view(w, L, H)
                bad = [i for i in range(L) if not torch.equal(fa[:, i], fb[:, i])]
                if bad:
                    return {"layer": bad[0], "kind": kinds[bad[0]], "max_abs": float((fa[:, bad[0]].float() - fb[:, bad[0]].float()).abs().max())}
            return None

        show({"check": "pass", "w": w, "count": count,
              "eager_differing": differing(eager), "eager_first": first_layer(eager),
              "graph_differing": differing(replays), "graph_first": first_layer(replays),
              "graph_vs_eager_equal": differing([eager[0], replays[0]]) == 0})
    finally:
        target.feature_layers = taps


def decodes(session, prompt: list[int], tokens: int, max_context: int) -> None:
    runs = engines(session, max_context)
    ar = make_policy("ar", session.drafter.draft_len)
    out = {}
    for path in ("graph", "resident_eager", "eager"):
        out[path] = [runs[path].generate(prompt, policy=ar, max_new_tokens=tokens).token_ids for _ in range(2)]
    ref = out["eager"][0]

    def first(a):
        return next((i for i, (x, y) in enumerate(zip(a, ref)) if x != y), None)

    show({"check": "decode", "tokens": tokens,
          "first_difference_from_eager_run_1": {p: [first(r) for r in rs] for p, rs in out.items()}})


def traced_decodes(session, prompt: list[int], tokens: int, max_context: int) -> None:
    """Every pass's layer outputs and logits through two `ar` requests on a fresh engine, for the
    resident round run eagerly and the host-driven round: the first pass and layer where request 2
    differs from request 1, and where the resident round differs from the host's."""
    target = session.target
    L, H, kinds = len(target.layers), target.cfg.hidden_size, target.cfg.layer_types
    taps, target.feature_layers = target.feature_layers, tuple(range(L))
    forward = target.forward_pass
    trace: list = []

    def recording(block, cache, **kw):
        out = forward(block, cache, **kw)
        trace.append((out.features.clone(), out.logits.clone()))
        return out

    target.forward_pass = recording
    try:
        ar = make_policy("ar", session.drafter.draft_len)
        runs = {}
        for path, resident in (("resident_eager", True), ("eager", False)):
            engine = Engine(target, None, max_context=max_context, resident=resident, graphs=False)
            for request in (1, 2):
                trace.clear()
                engine.generate(prompt, policy=ar, max_new_tokens=tokens)
                runs[(path, request)] = list(trace)
            del engine
    finally:
        target.forward_pass, target.feature_layers = forward, taps

    def first(a, b):
        for i, ((fa, la), (fb, lb)) in enumerate(zip(a, b)):
            if torch.equal(fa, fb) and torch.equal(la, lb):
                continue
            w = fa.shape[1]
            fa, fb = fa.view(w, L, H), fb.view(w, L, H)
            bad = [j for j in range(L) if not torch.equal(fa[:, j], fb[:, j])]
            return {"pass": i, "of": len(a), "layer": bad[0] if bad else None, "kind": kinds[bad[0]] if bad else None,
                    "layers_differing": len(bad), "max_abs_logits": float((la.float() - lb.float()).abs().max())}
        return None

    show({"check": "traced_decode", "passes": {k[0] + f"_{k[1]}": len(v) for k, v in runs.items()},
          "resident_eager_2_vs_1": first(runs[("resident_eager", 1)], runs[("resident_eager", 2)]),
          "eager_2_vs_1": first(runs[("eager", 1)], runs[("eager", 2)]),
          "resident_eager_1_vs_eager_1": first(runs[("resident_eager", 1)], runs[("eager", 1)]),
          "resident_eager_2_vs_eager_1": first(runs[("resident_eager", 2)], runs[("eager", 1)])})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.6-35b-a3b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--checks", default="moe,prefill,pass,decode,trace")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run (fp32, PyTorch backend, no graphs)")
    args = ap.parse_args(argv)
    checks = set(args.checks.split(","))
    max_context = args.context + 4 * args.tokens + 64
    cuda = args.device == "cuda"
    session = open_session(args.model, "random", device=args.device, dtype="bfloat16" if cuda else "float32",
                           backend="triton" if cuda else "torch", max_context=max_context)
    target = session.target
    prompt = prompts_for(session, args.model, args.context, 1)[0]
    with torch.no_grad():
        if "moe" in checks:
            moe_alone(target, args.calls)
        if "prefill" in checks:
            prefill_twice(target, prompt, max_context)
        if "pass" in checks:
            for w in (1, 16):
                passes(target, prompt, w, args.passes, 16)
    if "decode" in checks and cuda:
        decodes(session, prompt, args.tokens, max_context)
    if "trace" in checks:
        traced_decodes(session, prompt, args.tokens, max_context)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
