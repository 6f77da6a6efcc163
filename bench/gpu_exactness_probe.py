"""Which decoding paths agree token by token: `ar` on a random-weight preset (bf16) through the
resident round as CUDA graphs, the resident round run eagerly, and the host-driven round, each
printed, then the graph path again (is it deterministic?). The graph and eager paths run the same
kernels, so a difference points at a kernel whose result depends on how it is launched.

    python3 bench/gpu_exactness_probe.py [--model qwen3.6-35b-a3b] [--tokens 16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_round import engines, prompts_for  # noqa: E402
from hybridspec.runtime.policies import make_policy  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen3.6-35b-a3b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    max_context = args.context + 4 * args.tokens + 64
    session = open_session(args.model, "random", device="cuda", dtype="bfloat16", backend="triton",
                           max_context=max_context)
    runs = engines(session, max_context)
    prompt = prompts_for(session, args.model, args.context, 2)[0]
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
