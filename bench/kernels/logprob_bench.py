"""The log-probability rows kernel (`kernels/logprobs/triton.py`) beside its PyTorch reference, at
the 35B preset's vocabulary: each form checked first (float64 log-probabilities, every id holding
its value), then timed as one CUDA graph of 20 calls.

    python3 bench/kernels/logprob_bench.py --out OUT [--rows 1,4,16] [--tops 5,20]

Writes OUT/logprob_bench.json (`{"device", "date", "versions", "copy_bandwidth_GBps", "rows":
[{"form", "rows", "top", "vocab", "us", "floor_us"}]}`); the floor is the logits' bytes over the
copy bandwidth.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cuda_timing import gpu_run, graph_us, write_result  # noqa: E402

from hybridspec.kernels.logprobs import reference  # noqa: E402
from hybridspec.kernels.logprobs.triton import logprob_rows  # noqa: E402

FORMS = {"kernel": logprob_rows, "torch": reference.logprob_rows}


def check(form, logits: torch.Tensor, tokens: torch.Tensor, top: int) -> None:
    """AssertionError unless `form`'s rows hold the float64 log-probabilities (within 1e-4) and ids
    whose log-probabilities are the row's top values."""
    got = form(logits, tokens, top)
    logp = torch.log_softmax(logits.double(), -1)
    want = torch.cat((logp.gather(1, tokens.view(-1, 1)), logp.topk(top, -1).values), 1)
    torch.testing.assert_close(got[:, : 1 + top].double(), want, rtol=0, atol=1e-4)
    ids = got[:, 1 + top :].long()
    torch.testing.assert_close(logp.gather(1, ids), want[:, 1:], rtol=0, atol=1e-4)
    assert all(len(set(r)) == top for r in ids.tolist())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", default="1,4,16")
    p.add_argument("--tops", default="5,20")
    p.add_argument("--vocab", type=int, default=248_320)
    args = p.parse_args(argv)
    start = gpu_run("logprob_bench.py", argv)
    if start is None:
        return 1
    bandwidth, result = start
    g = torch.Generator(device="cuda").manual_seed(0)
    for n in map(int, args.rows.split(",")):
        logits = (torch.randn(n, args.vocab, device="cuda", generator=g) * 4).bfloat16()
        logits[:, ::97] = logits[:, :1]  # ties across blocks
        tokens = torch.randint(0, args.vocab, (n,), device="cuda", generator=g)
        for top in map(int, args.tops.split(",")):
            floor = logits.numel() * logits.element_size() / bandwidth * 1e6
            for name, form in FORMS.items():
                check(form, logits, tokens, top)
                out = torch.empty(n, 1 + 2 * top, device="cuda")
                us = graph_us([lambda f=form: f(logits, tokens, top, out)] * 20, samples=20, replays=5)
                result["rows"].append(dict(form=name, rows=n, top=top, vocab=args.vocab, us=us, floor_us=floor))
                print(f"  {name:7s} rows {n:2d} top {top:2d}: {us:7.2f} µs (floor {floor:.2f})", flush=True)
    write_result(args.out, "logprob_bench.json", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
