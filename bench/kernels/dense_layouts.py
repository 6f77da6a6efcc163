"""The runtime's few-row dense products under each weight layout and BLAS library torch offers (GPU).

Whether another operand order or BLAS library reads the weights of the 35B preset's dense products
at M ≤ 16 rows closer to their floor than what the runtime runs (`bench/results/linear_notes.md`).
The library picks its kernel from the problem's layout and from which library torch calls, so this
times, for each shape and M, side by side in one process:

    linear        F.linear(x, W), W [N, K] as the checkpoints store it, under torch's BLAS default
                  (what the runtime runs; recorded as `blas_default`)
    kn            x @ Wt, Wt = W.t().contiguous() [K, N] (the same product, the other operand order)
    linear-cublas, kn-cublas, linear-lt, kn-lt   the same under
                  torch.backends.cuda.preferred_blas_library("cublas") or ("cublaslt")

each checked against `linear` first (the same products: equal within bf16 rounding), each in a
CUDA graph of calls on rotated weight copies (more bytes than the L2 holds, so every call reads
its weights from HBM), with the floor: the weight bytes over the copy bandwidth of the same run.

    python3 bench/kernels/dense_layouts.py --out DIR [--rows 1,2,4,8,16]

Writes DIR/dense_layouts.json ({"device", "date", "versions", "copy_bandwidth_TBps", "blas_default",
"checks": [{"shape", "M", "impl", "relative_error", "ok"}], "rows": [{"shape", "M", "impl",
"median_us", "floor_us"}]}) and prints a table of µs and ratios to the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.kernels.cuda_timing import capture, copy_bandwidth, median_us  # noqa: E402

# the 35B preset's dense products per pass: (name, K, N)
SHAPES = (("gdn-in 2048→12352", 2048, 12352), ("out 4096→2048", 4096, 2048),
          ("attn-qkv 2048→9216", 2048, 9216), ("lm-head 2048→248320", 2048, 248320))
IMPLS = ("linear", "kn", "linear-cublas", "kn-cublas", "linear-lt", "kn-lt")
LIBRARY = {"cublas": "cublas", "lt": "cublaslt"}  # an impl's suffix → the library preferred
L2_BYTES = 50 * 2**20


def product(impl: str, x: torch.Tensor, w: torch.Tensor, wt: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w) if impl.startswith("linear") else x @ wt


@contextlib.contextmanager
def library(impl: str):
    """The impl's BLAS library preferred inside the block (torch's default for unsuffixed impls)."""
    previous = torch.backends.cuda.preferred_blas_library()
    suffix = impl.rsplit("-", 1)[-1]
    torch.backends.cuda.preferred_blas_library(LIBRARY.get(suffix, previous))
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def time_impl(impl: str, xs, ws, wts, samples: int = 15, replays: int = 10) -> float:
    """µs per call of a graph of one call per rotated weight copy, captured (and replayed) with the
    impl's BLAS library preferred."""
    with library(impl):
        calls = [lambda x=x, w=w, wt=wt: product(impl, x, w, wt) for x, w, wt in zip(xs, ws, wts)]
        return median_us(capture(calls), len(calls), samples, replays)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,2,4,8,16")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("dense_layouts.py needs a CUDA GPU", file=sys.stderr)
        return 2
    bandwidth = copy_bandwidth(samples=9)
    result = dict(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(),
                  versions=dict(python=platform.python_version(), torch=torch.__version__,
                                cuda=str(torch.version.cuda)),
                  copy_bandwidth_TBps=round(bandwidth / 1e12, 3), blas_default=str(
                      torch.backends.cuda.preferred_blas_library()), checks=[], rows=[])
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{result['device']} copy {bandwidth / 1e12:.2f} TB/s; µs per call (ratio to the weight floor)")
    print(f"{'shape':22} {'M':>3} " + " ".join(f"{impl:>20}" for impl in IMPLS))
    for name, k, n in SHAPES:
        nbytes = k * n * 2
        copies = max(2, -(-2 * L2_BYTES // nbytes))  # rotated so the L2 never holds the next call's weights
        ws = [torch.randn(n, k, generator=gen, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        wts = [w.t().contiguous() for w in ws]
        floor_us = nbytes / bandwidth * 1e6
        for m in (int(v) for v in args.rows.split(",") if v):
            xs = [torch.randn(m, k, generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            want = F.linear(xs[0], ws[0]).float()
            for impl in IMPLS[1:]:  # correctness first: the same product within bf16 rounding
                with library(impl):
                    got = product(impl, xs[0], ws[0], wts[0]).float()
                err = ((got - want).norm() / want.norm()).item()
                result["checks"].append(dict(shape=name, M=m, impl=impl, relative_error=err, ok=err < 1e-2))
            times = {impl: time_impl(impl, xs, ws, wts) for impl in IMPLS}
            for impl, us in times.items():
                result["rows"].append(dict(shape=name, M=m, impl=impl, median_us=round(us, 2),
                                           floor_us=round(floor_us, 2)))
            print(f"{name:22} {m:>3} " + " ".join(f"{us:>11.2f} ({us / floor_us:4.2f}×)" for us in times.values()),
                  flush=True)
        del ws, wts
        torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dense_layouts.json").write_text(json.dumps(result, indent=1))
    bad = [c for c in result["checks"] if not c["ok"]]
    print("checks:", "all equal within bf16 rounding" if not bad else bad)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
