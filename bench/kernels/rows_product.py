"""One- and two-token dense products of the 35B preset's layers: the library product (`F.linear`,
cuBLAS) beside `kernels.linear.rows_linear` (each program one [BN, K] slice of the weight in
registers) at several slice shapes, and the floor (the weight's bytes over the copy bandwidth of the
same run).

Shapes: the GDN input projections fused (12,352 × 2,048), the attention's q/k/v fused (9,216 ×
2,048), an output projection (2,048 × 4,096: GDN and attention alike), the router (256 × 2,048).
Each product runs on its own copies of the weight (about 200 MB in all, at most 96 copies: past
the L2 but for the router's 96 MB), one CUDA graph of all copies in stream order (the Triton
launches with programmatic dependent launch, as in the round), median µs per call.

    python3 bench/kernels/rows_product.py --out OUT [--tokens 1,2,4] [--norms]

`--norms` times instead the products with a norm applied inside (`norm_linear` at the input
projections' shapes, `gated_linear` at the out-projection's, the latter at several (BN, warps))
against the norm's own launch followed by the register-slice product, each call of the graph both
launches of one layer.

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

from hybridspec.kernels import pdl  # noqa: E402
from hybridspec.kernels.linear.rows_gated import launch_rows_gated_linear  # noqa: E402
from hybridspec.kernels.linear.triton import norm_linear, rows_linear  # noqa: E402
from hybridspec.kernels.norm.triton import gated_rms_norm, offset_rms_norm  # noqa: E402

SHAPES = {"gdn in_proj": (12352, 2048), "attention qkv": (9216, 2048), "out_proj": (2048, 4096),
          "router": (256, 2048)}
FORMS = [(1, 2), (1, 4), (2, 2), (2, 4), (4, 4)]  # (BN, warps) of rows_linear


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tokens", default="1,2,4")
    ap.add_argument("--norms", action="store_true", help="the products with a norm inside, against two launches")
    args = ap.parse_args(argv)
    from cuda_timing import gpu_run, graph_us, max_relative_error, write_result

    if (run := gpu_run("rows_product.py", argv)) is None:
        return 2
    bandwidth, result = run
    g = torch.Generator(device="cuda").manual_seed(0)
    print("| shape | T | impl | µs | floor µs | × floor |\n|---|---|---|---|---|---|")
    if args.norms:
        return norm_forms(args, bandwidth, result, g)
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


GATED_FORMS = [(1, 4), (1, 8), (2, 4), (2, 8)]  # (BN, warps) of the out-projection with the gated norm


def gated_fused(o, z, nw, w, bn, warps):
    y = torch.empty(o.shape[0], w.shape[0], dtype=z.dtype, device=z.device)
    launch_rows_gated_linear(o, z, nw, 1e-6, w, y, bn, warps, pdl.options(z))
    return y


def norm_forms(args, bandwidth: float, result: dict, g) -> int:
    from cuda_timing import graph_us, max_relative_error, write_result

    for shape in ("gdn in_proj", "attention qkv", "out_proj"):
        r, k = SHAPES[shape]
        copies = max(4, min(96, -(-200_000_000 // (r * k * 2))))
        ws = [(torch.randn(r, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16) for _ in range(copies)]
        floor = r * k * 2 / bandwidth * 1e6
        for t in (int(v) for v in args.tokens.split(",")):
            if shape == "out_proj":  # 32 heads of 128: o fp32, the gate sliced from a wider projection
                o = torch.randn(t, 32, 128, device="cuda", generator=g)
                z = torch.randn(t, 12352, device="cuda", generator=g).bfloat16()[:, 8192:12288].view(t, 32, 128)
                nw = (1 + 0.1 * torch.randn(128, device="cuda", generator=g)).bfloat16()
                want = gated_rms_norm(o, z, nw, 1e-6).reshape(t, -1).float() @ ws[0].float().T
                impls = {("norm launch + rows", 1, 4): lambda w: rows_linear(
                    gated_rms_norm(o, z, nw, 1e-6).reshape(t, -1), w)}
                for bn, warps in GATED_FORMS:
                    impls[("gated inside", bn, warps)] = lambda w, bn=bn, warps=warps: gated_fused(o, z, nw, w, bn,
                                                                                                    warps)
            else:
                x, res = (torch.randn(1, t, k, device="cuda", generator=g).bfloat16() for _ in range(2))
                nw = (0.1 * torch.randn(k, device="cuda", generator=g)).bfloat16()
                want = offset_rms_norm(x, nw, 1e-6, res)[0].float() @ ws[0].float().T
                impls = {("norm launch + rows", 1, 4): lambda w: rows_linear(offset_rms_norm(x, nw, 1e-6, res)[0], w),
                         ("norm inside", 1, 4): lambda w: norm_linear(x, nw, 1e-6, res, w)[0]}
            for (impl, bn, warps), fn in impls.items():
                if (err := max_relative_error(fn(ws[0]).reshape(want.shape), want)) > 1e-2:
                    print(f"{shape} T={t} {impl} {bn}/{warps}: relative error {err:.2e}")
                    return 1
                us = graph_us([lambda w=w: fn(w) for w in ws], samples=15, replays=5)
                result["rows"].append(dict(shape=shape, T=t, impl=impl, bn=bn, warps=warps, us=round(us, 2),
                                           floor_us=round(floor, 2), ratio=round(us / floor, 3)))
                print(f"| {shape} | {t} | {impl} ({bn} × {k}, {warps} warps) | {us:.2f} | {floor:.2f} | "
                      f"{us / floor:.2f} |", flush=True)
        del ws
    write_result(args.out, "rows_product_norms.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
