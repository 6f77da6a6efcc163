"""A mixer's out-projection, residual add and post-attention norm on the GPU: the library product
then the norm's fused add (`F.linear` + `kernels/norm`, three kernels: cuBLAS's split-K pair and the
norm) beside `kernels/linear`'s two launches (split-K parts, the norm summing them) at several
launch shapes, for the presets' out-projections ([T, K] × [K, hidden], bf16); the GDN layer's
ending with its gated output norm (the norm's launch, the library product, the norm: four kernels)
beside the parts kernel applying that norm as it loads the heads (`gate=`, two); and the floor (the
weight's bytes over the copy bandwidth of the same run).

    python3 bench/kernels/out_add_norm.py --out OUT [--models 35b,122b] [--tokens 1,2,4,8,16]

1. correctness first: every launch shape's (y, s) within bf16 rounding of the library path's, and
   each row of a 16-row call bit-equal to the row run alone;
2. timing: one CUDA graph of ROTATIONS calls, each on its own weight copy (more than the L2 in all),
   median µs per call over 20 samples of 10 replays.
Writes OUT/out_add_norm.json ({"device", "date", "versions", "bandwidth", "rows": [{"impl", "model",
"T", "median_us"}]}) and prints a table.
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

from hybridspec.kernels.linear import triton as linear_triton
from hybridspec.kernels.linear.triton import LinearTiles
from hybridspec.kernels.norm import triton as norm_triton
from hybridspec.runtime.presets import preset_config

MODELS = {"35b": "qwen3.6-35b-a3b", "122b": "qwen3.5-122b-a10b"}
ROTATIONS = 12
SHAPES = {
    "shipped": linear_triton.TILES,
    "n16": LinearTiles(block_n=16),
    "span1024": LinearTiles(span=1024),
    "span256": LinearTiles(span=256, block_k=256),
    "n64-k256": LinearTiles(block_n=64, block_k=256),
    "w8": LinearTiles(warps=8),
    "late-weights": LinearTiles(early_weights=False),  # the first weight tile read after the PDL wait
}


def shapes(model: str) -> tuple[int, int, int]:
    """(K, N, dv): the GDN out-projection's input width (the attention's is the same in these
    presets), the hidden size, and the GDN value head width."""
    cfg = preset_config(MODELS[model])
    dv = cfg["linear_value_head_dim"]
    return cfg["linear_num_value_heads"] * dv, cfg["hidden_size"], dv


def library(x, w, r, nw):
    return norm_triton.offset_rms_norm(F.linear(x, w), nw, 1e-6, r)


def library_gated(o, z, gw, w, r, nw):
    """The GDN layer's ending today: the gated norm's launch, the library product, the norm."""
    return library(norm_triton.gated_rms_norm(o, z, gw, 1e-6).flatten(-2), w, r, nw)


def fused_gated(o, z, gw, w, r, nw):
    return linear_triton.linear_add_norm(o, w, r, nw, 1e-6, gate=z, gate_weight=gw, gate_eps=1e-6)


def inputs(model: str, tokens: int, seed: int):
    k, n, _ = shapes(model)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).to(torch.bfloat16)
    r = torch.randn(tokens, n, device="cuda", generator=g).to(torch.bfloat16)
    nw = (torch.randn(n, device="cuda", generator=g) * 0.2).to(torch.bfloat16)
    return x, w, r, nw


def gated_inputs(model: str, tokens: int, seed: int):
    """(heads, gate, gate weight, weight, residual, norm weight) of a GDN layer's ending."""
    k, n, dv = shapes(model)
    x, w, r, nw = inputs(model, tokens, seed)
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    z = (3 * torch.randn(tokens, k // dv, dv, device="cuda", generator=g)).to(torch.bfloat16)
    gw = (1 + 0.3 * torch.randn(dv, device="cuda", generator=g)).to(torch.bfloat16)
    return x.view(tokens, k // dv, dv), z, gw, w, r, nw


def check(model: str, tokens: int, tiles: LinearTiles) -> None:
    x, w, r, nw = inputs(model, tokens, tokens)
    torch.cuda.set_sync_debug_mode("error")
    try:
        y, s = linear_triton.linear_add_norm(x, w, r, nw, 1e-6, tiles=tiles)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    y_ref, s_ref = library(x, w, r, nw)
    torch.testing.assert_close(s.float(), s_ref.float(), rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1.6e-2, atol=3e-2)
    for t in (0, tokens - 1):
        y1, s1 = linear_triton.linear_add_norm(x[t:t + 1], w, r[t:t + 1], nw, 1e-6, tiles=tiles)
        assert torch.equal(y1, y[t:t + 1]) and torch.equal(s1, s[t:t + 1]), f"{model} T={tokens}: row {t} differs"


def check_gated(model: str, tokens: int) -> None:
    args = gated_inputs(model, tokens, tokens)
    (y, s), (y_ref, s_ref) = fused_gated(*args), library_gated(*args)
    torch.testing.assert_close(s.float(), s_ref.float(), rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1.6e-2, atol=3e-2)


def time_impl(fn, model: str, tokens: int, gated: bool = False) -> float:
    sets = [(gated_inputs if gated else inputs)(model, tokens, 100 + i) for i in range(ROTATIONS)]
    graph = capture([lambda a=a: fn(*a) for a in sets])
    return median_us(graph, ROTATIONS, samples=20, replays=10)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", default="35b,122b")
    ap.add_argument("--tokens", default="1,2,4,8,16")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    models, lengths = args.models.split(","), [int(t) for t in args.tokens.split(",")]
    for model in models:
        for tokens in lengths:
            for tiles in SHAPES.values():
                check(model, tokens, tiles)
            check_gated(model, tokens)
        print(f"check {model}: every launch shape within bf16 rounding of the library path, rows batch-invariant; "
              "the gated heads within bf16 rounding of the gated norm's launch + the library path", flush=True)
    impls = {"library": library} | {
        f"fused:{name}": (lambda x, w, r, nw, tiles=tiles: linear_triton.linear_add_norm(x, w, r, nw, 1e-6,
                                                                                        tiles=tiles))
        for name, tiles in SHAPES.items()}
    gated_impls = {"library-gated": library_gated, "fused-gated": fused_gated}
    bandwidth = copy_bandwidth(10)
    result = {"device": torch.cuda.get_device_name(), "date": dt.date.today().isoformat(),
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "triton": __import__("triton").__version__},
              "bandwidth": bandwidth, "rows": []}
    for model in models:
        k, n, _ = shapes(model)
        floor = k * n * 2 / bandwidth * 1e6
        for tokens in lengths:
            times = {impl: time_impl(fn, model, tokens) for impl, fn in impls.items()}
            times |= {impl: time_impl(fn, model, tokens, gated=True) for impl, fn in gated_impls.items()}
            result["rows"] += [dict(impl=impl, model=model, T=tokens, median_us=round(us, 2))
                               for impl, us in times.items()]
            result["rows"].append(dict(impl="floor", model=model, T=tokens, median_us=round(floor, 2)))
            best = min((us, impl) for impl, us in times.items() if impl.startswith("fused:"))
            print(f"{model} T={tokens:2d} " + " ".join(f"{i} {us:6.2f}" for i, us in times.items())
                  + f" floor {floor:5.2f}  library / {best[1]} {times['library'] / best[0]:.2f}×  library-gated / "
                  f"fused-gated {times['library-gated'] / times['fused-gated']:.2f}×", flush=True)
        (args.out / "out_add_norm.json").write_text(json.dumps(result, indent=1))  # after each model
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
