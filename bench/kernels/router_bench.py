"""The MoE router on the GPU: the one-launch Triton router (`kernels.moe.router.router`) beside
the library product plus the Triton top-k (`F.linear` then `router_topk`, two launches) and the
PyTorch reference (`reference.router`), at the router shapes of the presets (bf16), T tokens per
call, and the floor (the router weight's bytes over the copy bandwidth of the same run).

    python3 bench/kernels/router_bench.py --out OUT [--tokens 1,2,4,8,16] [--sweep]

`--sweep` also times the one-launch router at the launch shapes of `SWEEP` (`RouterTiles`: the
register-slice form's experts per program and warps, and that form at two tokens), each checked
like the shipped one first.

1. correctness first: for every shape and T, the one-launch router's logits within bf16 rounding of
   F.linear's and its experts a top-k of the reference softmax of those logits (ties by lower id);
   one call under `torch.cuda.set_sync_debug_mode("error")`;
2. timing: one CUDA graph of ROTATIONS calls, each on its own copy of the router weight (96 MB in
   all, more than the L2), median µs per call over 20 samples of 10 replays.
Writes OUT/router_bench.json ({"device", "date", "versions", "bandwidth", "rows": [{"impl", "model",
"T", "median_us"}]}) and prints a table with ratios.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda_timing import capture, copy_bandwidth, median_us

from hybridspec.kernels.moe import reference
from hybridspec.kernels.moe import router as triton_router
from hybridspec.runtime.presets import preset_config

MODELS = {"35b": "qwen3.6-35b-a3b", "122b": "qwen3.5-122b-a10b", "80b": "qwen3-next-80b-a3b"}
ROTATIONS = 96


def shapes(model: str) -> tuple[int, int, int]:
    cfg = preset_config(MODELS[model])
    return cfg["num_experts"], cfg["num_experts_per_tok"], cfg["hidden_size"]


IMPLS = {
    "fused": lambda x, w, k: triton_router.router(x, w, k, True, x.dtype),
    "fused-tiles": lambda x, w, k: triton_router.router(x, w, k, True, x.dtype,
                                                        tiles=triton_router.ROUTER_TILES.replace(rows_tokens=0)),
    "linear+topk": lambda x, w, k: triton_router.router_topk(F.linear(x, w), k, True, x.dtype),
    "reference": lambda x, w, k: reference.router(x, w, k, True, x.dtype),
}


SWEEP = {  # the register-slice form's launch shapes beside the shipped one (the tail's reductions in fewer warps)
    name: triton_router.ROUTER_TILES.replace(**fields)
    for name, fields in (("rows-w1", {"rows_warps": 1}), ("rows-w2", {"rows_warps": 2}),
                         ("rows-be2-w1", {"rows_be": 2, "rows_warps": 1}),
                         ("rows-be4-w2", {"rows_be": 4, "rows_warps": 2}),
                         ("rows-to-2-w1", {"rows_tokens": 2, "rows_warps": 1}))
}


def check(model: str, tokens: int, tiles=triton_router.ROUTER_TILES) -> str:
    e, k, h = shapes(model)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(e, h, device="cuda", generator=g) / h ** 0.5).to(torch.bfloat16)
    logits = torch.empty(tokens, e, device="cuda", dtype=torch.bfloat16)
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids, weights = triton_router.router(x, w, k, True, torch.bfloat16, logits=logits, tiles=tiles)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(logits.float(), F.linear(x.float(), w.float()), rtol=8e-3, atol=8e-3)
    probs = torch.softmax(logits.float(), -1)
    chosen = probs.gather(1, ids)
    rest = probs.scatter(1, ids, -1.0)
    assert bool((chosen.min(1).values >= rest.max(1).values).all()), f"{model} T={tokens}: not a top-{k}"
    torch.testing.assert_close(weights.float(), chosen / chosen.sum(-1, keepdim=True), rtol=8e-3, atol=1e-3)
    ref_ids = reference.router(x, w, k, True, torch.bfloat16)[0]
    same = float((ids.sort(1).values == ref_ids.sort(1).values).all(1).float().mean())
    return f"ok (expert sets equal to the reference's for {same:.0%} of tokens; the rest differ at bf16 ties)"


def time_impl(impl: str, model: str, tokens: int) -> float:
    e, k, h = shapes(model)
    g = torch.Generator(device="cuda").manual_seed(1)
    ws = [(torch.randn(e, h, device="cuda", generator=g) / h ** 0.5).to(torch.bfloat16) for _ in range(ROTATIONS)]
    xs = [torch.randn(tokens, h, device="cuda", generator=g).to(torch.bfloat16) for _ in range(ROTATIONS)]
    fn = IMPLS[impl]
    rounds = [lambda x=x, w=w: fn(x, w, k) for x, w in zip(xs, ws)]
    graph = capture(rounds)
    return median_us(graph, ROTATIONS, samples=20, replays=10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="35b,122b,80b")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--sweep", action="store_true", help="also the launch shapes of SWEEP")
    args = ap.parse_args(argv)
    if args.sweep:
        for name, tiles in SWEEP.items():
            IMPLS[f"fused:{name}"] = lambda x, w, k, tiles=tiles: triton_router.router(x, w, k, True, x.dtype,
                                                                                      tiles=tiles)
    args.out.mkdir(parents=True, exist_ok=True)
    models, lengths = args.models.split(","), [int(t) for t in args.tokens.split(",")]
    for model in models:
        for tokens in lengths:
            print(f"check {model} T={tokens}: {check(model, tokens)}", flush=True)
            for name, tiles in (SWEEP.items() if args.sweep else ()):
                print(f"check {model} T={tokens} {name}: {check(model, tokens, tiles)}", flush=True)
    bandwidth = copy_bandwidth(10)
    rows = []
    for model in models:
        e, k, h = shapes(model)
        floor = e * h * 2 / bandwidth * 1e6
        for tokens in lengths:
            times = {impl: time_impl(impl, model, tokens) for impl in IMPLS}
            rows += [dict(impl=impl, model=model, T=tokens, median_us=round(us, 2)) for impl, us in times.items()]
            rows.append(dict(impl="floor", model=model, T=tokens, median_us=round(floor, 2)))
            print(f"{model} T={tokens:2d} " + " ".join(f"{i} {us:6.2f}" for i, us in times.items())
                  + f" floor {floor:5.2f}  linear+topk / fused {times['linear+topk'] / times['fused']:.2f}×", flush=True)
    result = {"device": torch.cuda.get_device_name(), "date": dt.date.today().isoformat(),
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "triton": __import__("triton").__version__},
              "bandwidth": bandwidth, "rows": rows}
    (args.out / "router_bench.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
