"""One- and two-token dense products of the 35B preset's layers: the library product (`F.linear`,
cuBLAS) beside `kernels.linear.rows_linear` (each program one [BN, K] slice of the weight in
registers) at several slice shapes, and the floor (the weight's bytes over the copy bandwidth of the
same run).

Shapes: the GDN input projections fused (12,352 × 2,048), the attention's q/k/v fused (9,216 ×
2,048), an output projection (2,048 × 4,096: GDN and attention alike), the router (256 × 2,048).
Each product runs on its own copies of the weight (about 200 MB in all, at most 96 copies: past
the L2 but for the router's 96 MB), one CUDA graph of all copies in stream order (the Triton
launches with programmatic dependent launch, as in the round), median µs per call.

    python3 bench/kernels/rows_product.py --out OUT [--tokens 1,2,4]

Checks every form against the fp32 product first. Prints a table and writes OUT/rows_product.json
(`{"device", "date", "versions", "copy_bandwidth_GBps", "rows": [{"shape", "T", "impl", "bn",
"warps", "us", "floor_us", "ratio"}]}`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hybridspec.kernels.linear.triton import rows_linear  # noqa: E402

SHAPES = {"gdn in_proj": (12352, 2048), "attention qkv": (9216, 2048), "out_proj": (2048, 4096),
          "router": (256, 2048)}
FORMS = [(1, 2), (1, 4), (2, 2), (2, 4), (4, 4)]  # (BN, warps) of rows_linear


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="1,2,4")
    args = ap.parse_args(argv)
    from cuda_timing import gpu_run, graph_us, max_relative_error, write_result

    if (run := gpu_run("rows_product.py", argv)) is None:
        return 2
    bandwidth, result = run
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| shape | T | impl | µs | floor µs | × floor |\n|---|---|---|---|---|---|")
    for shape, (r, k) in SHAPES.items():
        copies = max(4, min(96, -(-200_000_000 // (r * k * 2))))
        ws = [(torch.randn(r, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16) for _ in range(copies)]
        floor = r * k * 2 / bandwidth * 1e6
        for t in (int(v) for v in args.tokens.split(",")):
            x = torch.randn(t, k, device="cuda", generator=g).to(torch.bfloat16)
            want = x.float() @ ws[0].float().T
            impls = {("cublas", 0, 0): lambda w: F.linear(x, w)}
            for bn, warps in FORMS:
                if bn * k * 2 <= 65536:
                    impls[("rows", bn, warps)] = lambda w, bn=bn, warps=warps: rows_linear(x, w, bn, warps)
            for (impl, bn, warps), fn in impls.items():
                if (err := max_relative_error(fn(ws[0]), want)) > 1e-2:
                    print(f"{shape} T={t} {impl} {bn}/{warps}: relative error {err:.2e}")
                    return 1
                us = graph_us([lambda w=w: fn(w) for w in ws], samples=15, replays=5)
                result["rows"].append(dict(shape=shape, T=t, impl=impl, bn=bn, warps=warps, us=round(us, 2),
                                           floor_us=round(floor, 2), ratio=round(us / floor, 3)))
                name = impl if impl == "cublas" else f"rows {bn} × {k}, {warps} warps"
                print(f"| {shape} | {t} | {name} | {us:.2f} | {floor:.2f} | {us / floor:.2f} |", flush=True)
        del ws
    write_result(args.out, "rows_product.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
