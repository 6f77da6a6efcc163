"""What one dependent launch costs inside a CUDA graph on this GPU: the unit in which a decoding
pass's time over its bytes is counted (a one-token pass of the 35B preset is about 470 launches).

A chain of K launches of one small Triton kernel, each program reading the value the previous
launch wrote and writing the next, replayed as one graph; per row a grid (one program, or one per
SM), the bytes of weights each launch streams after its wait (each launch its own slice of a buffer
far larger than the L2, as a pass's layers read theirs), and programmatic dependent launch on or
off. The cost of a launch beyond its bytes is (chain time − K · bytes / copy bandwidth) / K.

    python3 bench/kernels/launch_chain.py --out OUT [--launches 200]

Prints a table and writes OUT/launch_chain.json (`{"device", "date", "versions",
"copy_bandwidth_GBps", "rows": [{"grid", "bytes", "pdl", "us_per_launch", "floor_us", "over_us"}]}`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybridspec.kernels.pdl import wait_then_release  # noqa: E402

BLOCK = 1024  # weight elements (bf16) per program and step


@triton.jit
def _link(src_ptr, dst_ptr, w_ptr, STEPS: tl.constexpr, BLOCK: tl.constexpr, USE_GDC: tl.constexpr):
    """dst[p] = src[p] + 1 + the sum of STEPS · BLOCK weights of this program's slice (the weights are
    zeros: the sum keeps the reads live and the values exact)."""
    pid = tl.program_id(0)
    if USE_GDC:
        wait_then_release()
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(STEPS):
        acc += tl.load(w_ptr + (pid * STEPS + s) * BLOCK + tl.arange(0, BLOCK)).to(tl.float32)
    x = tl.load(src_ptr + pid)
    tl.store(dst_ptr + pid, x + 1.0 + tl.sum(acc, 0))


def chain(launches: int, grid: int, weight_bytes: int, pdl: bool, device) -> tuple[list, torch.Tensor, int]:
    """The launches of one chain as callables (two ping-pong value buffers of `grid` floats, weights
    of `launches` slices of about `weight_bytes` each), the buffer the last launch writes, and the
    bytes each launch reads (whole steps of BLOCK bf16 values per program)."""
    steps = weight_bytes // (2 * BLOCK * grid)
    values = [torch.zeros(grid, dtype=torch.float32, device=device) for _ in range(2)]
    per_launch = max(1, grid * steps * BLOCK)
    weights = torch.zeros(launches * per_launch, dtype=torch.bfloat16, device=device)
    options = dict(USE_GDC=True, launch_pdl=True) if pdl else dict(USE_GDC=False)

    def link(i: int):
        src, dst = values[i % 2], values[(i + 1) % 2]
        w = weights[i * per_launch:]
        return lambda: _link[(grid,)](src, dst, w, STEPS=steps, BLOCK=BLOCK, **options)

    return [link(i) for i in range(launches)], values[launches % 2], 2 * grid * steps * BLOCK


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--launches", type=int, default=200)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("launch_chain.py needs a CUDA GPU", file=sys.stderr)
        return 2
    from cuda_timing import capture, copy_bandwidth, median_us, run_header

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bandwidth = copy_bandwidth(samples=10)
    result = run_header("launch_chain.py", argv, bandwidth)
    print("| grid | bytes per launch | PDL | µs per launch | bytes' floor µs | over µs |\n|---|---|---|---|---|---|")
    for grid, asked in ((1, 0), (sms, 0), (sms, 1 << 20), (sms, 16 << 20)):
        for pdl in (False, True):
            links, last, weight_bytes = chain(args.launches, grid, asked, pdl, "cuda")
            graph = capture(links)
            graph.replay()
            torch.cuda.synchronize()
            if not torch.all(last == 2 * args.launches):  # the warm-up's chain and the replay's
                print(f"grid {grid}, {weight_bytes} B, PDL {pdl}: wrong chain values {last[:4].tolist()}")
                return 1
            us = median_us(graph, args.launches, samples=10, replays=5)
            floor = weight_bytes / bandwidth * 1e6
            row = dict(grid=grid, bytes=weight_bytes, pdl=pdl, us_per_launch=round(us, 3),
                       floor_us=round(floor, 3), over_us=round(us - floor, 3))
            result["rows"].append(row)
            print(f"| {grid} | {weight_bytes} | {'on' if pdl else 'off'} | {us:.2f} | {floor:.2f} | {us - floor:.2f} |",
                  flush=True)
            del graph, links, last
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "launch_chain.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
