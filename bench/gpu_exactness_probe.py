"""Which decoding paths agree token by token, and where a graph and an eager pass part.

1. `ar` on a random-weight preset (bf16) through the resident round as CUDA graphs, the resident
   round run eagerly, and the host-driven round, each printed, then the graph path again (is it
   deterministic?).
2. One verification pass of w tokens after a prefill, eagerly twice and as a CUDA graph, with every
   layer's output tapped: the first layer whose output differs between graph and eager (and its
   type), how many differ, and whether the logits do. The graph and eager passes run the same
   kernels, so a difference points at a kernel whose result depends on how it is launched.

`--norms reference` puts the PyTorch norms back on the triton backend (is it the norm kernels?).

    python3 bench/gpu_exactness_probe.py [--model qwen3.6-35b-a3b] [--tokens 16] [--widths 1,2,8,16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.gpu_round import engines, prompts_for  # noqa: E402
from hybridspec.kernels.norm import reference as norm_reference  # noqa: E402
from hybridspec.runtime.layers.norms import GatedRMSNorm, OffsetRMSNorm  # noqa: E402
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from tests.runtime.helpers import pass_outputs, prefilled_cache  # noqa: E402


def layer_diff(target, prompt: list[int], w: int, W: int) -> dict:
    """Every layer's output of one pass of w tokens: eager, eager again, and as a CUDA graph."""
    device = next(target.parameters()).device
    taps, target.feature_layers = target.feature_layers, tuple(range(len(target.layers)))
    try:
        cache = prefilled_cache(target, prompt, W)
        block = torch.randint(0, target.cfg.vocab_size, (1, w), generator=torch.Generator().manual_seed(w)).to(device)

        eager = pass_outputs(target, cache, block, graph=False)
        again = pass_outputs(target, cache, block, graph=False)
        graph_out = pass_outputs(target, cache, block, graph=True) if device.type == "cuda" else None
        L, H = len(target.layers), target.cfg.hidden_size
        kinds = target.cfg.layer_types

        def compare(a, b) -> dict:
            fa, fb = a[0].view(1, w, L, H), b[0].view(1, w, L, H)
            differs = [i for i in range(L) if not torch.equal(fa[:, :, i], fb[:, :, i])]
            first_layer = differs[0] if differs else None
            return {"layers_differing": len(differs), "first_layer": first_layer,
                    "first_kind": kinds[first_layer] if differs else None,
                    "max_abs_diff_there": float((fa[:, :, first_layer].float() - fb[:, :, first_layer].float()).abs().max())
                    if differs else 0.0,
                    "logits_equal": torch.equal(a[1], b[1])}

        return {"w": w, "eager_vs_eager": compare(eager, again),
                "graph_vs_eager": compare(graph_out, eager) if graph_out is not None else None}
    finally:
        target.feature_layers = taps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.6-35b-a3b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--widths", default="1,2,8,16", help="pass lengths of the layer-by-layer comparison")
    ap.add_argument("--norms", choices=("kernel", "reference"), default="kernel")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the eager comparisons")
    args = ap.parse_args(argv)
    max_context = args.context + 4 * args.tokens + 64
    cuda = args.device == "cuda"
    session = open_session(args.model, "random", device=args.device, dtype="bfloat16" if cuda else "float32",
                           backend="triton" if cuda else "torch", max_context=max_context)
    if args.norms == "reference":
        for module in session.target.modules():
            if isinstance(module, OffsetRMSNorm):
                module.op = norm_reference.offset_rms_norm
            elif isinstance(module, GatedRMSNorm):
                module.op = norm_reference.gated_rms_norm
    print(f"{args.model} norms={args.norms}", flush=True)
    prompt = prompts_for(session, args.model, args.context, 2)[0]
    widths = [int(x) for x in args.widths.split(",") if x]
    for w in widths:
        print(" ", layer_diff(session.target, prompt, w, max(widths)), flush=True)
    if not cuda:
        return 0
    runs = engines(session, max_context)
    ar = make_policy("ar", session.drafter.draft_len)
    out = {path: runs[path].generate(prompt, policy=ar, max_new_tokens=args.tokens).token_ids
           for path in ("graph", "resident_eager", "eager")}
    for path, tokens in out.items():
        first = next((i for i, (a, b) in enumerate(zip(tokens, out["eager"])) if a != b), None)
        print(f"{path:15s} first difference from eager: {first}  {tokens}")
    print("graph deterministic:", runs["graph"].generate(prompt, policy=ar, max_new_tokens=args.tokens).token_ids
          == out["graph"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
