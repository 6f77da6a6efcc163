"""Dense projections of a few rows on the GPU: the Triton few-row product
(`kernels.linear.triton.linear`) beside the library's (`F.linear`, cuBLAS) and the floor (the
weight's bytes over the copy bandwidth of the same run), at the 35B preset's projection shapes
(bf16) and M rows per call.

    python3 bench/kernels/linear_bench.py --out OUT [--rows 1,2,4,8,16]

1. correctness first: every shape and M against an fp32 product on the same bf16 weights;
2. timing: one CUDA graph of calls each on its own copy of the weight (at least 96 MB of copies,
   more than the L2), median µs per call over 20 samples of 10 replays.
Writes OUT/linear_bench.json ({"device", "date", "versions", "bandwidth", "rows": [{"impl",
"shape", "M", "median_us"}]}) and prints ratios.
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

SHAPES = {  # name: (K, N) of x [M, K] · W[N, K]ᵀ in the qwen3.6-35b-a3b preset
    "gdn_in_proj": (2048, 12352),
    "out_proj": (4096, 2048),
    "attention_qkv": (2048, 9216),
    "lm_head": (2048, 248320),
}
IMPLS = {"triton": linear_triton.linear, "library": F.linear}


def check(shape: str, rows: int) -> None:
    k, n = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    want = F.linear(x.float(), w.float())
    for name, fn in IMPLS.items():
        torch.testing.assert_close(fn(x, w).float(), want, rtol=8e-3, atol=8e-3, msg=lambda m: f"{name} {shape}: {m}")


def time_impl(impl: str, shape: str, rows: int) -> float:
    k, n = SHAPES[shape]
    copies = max(2, -(-96 * 2**20 // (k * n * 2)))
    g = torch.Generator(device="cuda").manual_seed(2)
    ws = [(torch.randn(n, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16) for _ in range(copies)]
    xs = [torch.randn(rows, k, device="cuda", generator=g).to(torch.bfloat16) for _ in range(copies)]
    fn = IMPLS[impl]
    graph = capture([lambda x=x, w=w: fn(x, w) for x, w in zip(xs, ws)])
    us = median_us(graph, copies, samples=20, replays=10)
    del graph, ws, xs
    torch.cuda.empty_cache()
    return us


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    lengths, shapes = [int(r) for r in args.rows.split(",")], args.shapes.split(",")
    for shape in shapes:
        for rows in lengths:
            check(shape, rows)
    print("checks ok", flush=True)
    bandwidth = copy_bandwidth(10)
    out = []
    for shape in shapes:
        k, n = SHAPES[shape]
        floor = k * n * 2 / bandwidth * 1e6
        for rows in lengths:
            times = {impl: time_impl(impl, shape, rows) for impl in IMPLS}
            out += [dict(impl=i, shape=shape, M=rows, median_us=round(us, 2)) for i, us in times.items()]
            out.append(dict(impl="floor", shape=shape, M=rows, median_us=round(floor, 2)))
            print(f"{shape:14s} M={rows:2d} triton {times['triton']:8.2f} library {times['library']:8.2f} "
                  f"floor {floor:7.2f}  library / triton {times['library'] / times['triton']:.2f}×  "
                  f"triton / floor {times['triton'] / floor:.2f}×", flush=True)
    result = {"device": torch.cuda.get_device_name(), "date": dt.date.today().isoformat(),
              "versions": {"python": platform.python_version(), "torch": torch.__version__,
                           "cuda": torch.version.cuda, "triton": __import__("triton").__version__},
              "bandwidth": bandwidth, "rows": out}
    (args.out / "linear_bench.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
