"""Launch-parameter sweep of HybridSpec's GDN verify and commit kernels on one GPU.

    python bench/kernels/gdn_tuning.py --out DIR [--samples 15] [--replays 10] [--jobs 12]
                                       [--lengths 8,16] [--kinds split+pdl,...] [--no-commit]

Setting as bench/kernels/gdn_kernels.py (30 GDN layers of Qwen3.6-35B-A3B, bf16 inputs, fp32 states).
Verify-only and commit-only are timed separately, each as one CUDA graph of ROTATIONS rounds on
their own inputs and state pools (median of --samples samples of --replays replays):
  verify   30 x `gdn_verify_gated` at T in SWEEP_LENGTHS, for every VerifyTuning of `verify_variants`
           (the launch table with that entry at T), gated as the runtime calls it (raw q, k, a, b;
           norms and gates inside the kernel)
  commit   1 x `gdn_commit` of all 30 layers at T = 16 with m in {1, 8, 16}, per CommitTuning
  launch   30 x an empty Triton kernel (the graph's per-launch floor)
Every variant is first checked against float64 Eq. 1 with fp32 inputs (relative Frobenius error
below 1e-5, outputs and committed states); a variant that fails is reported and never chosen.
Kernels are compiled ahead of timing by --jobs worker processes (Triton's cache is shared).

Writes DIR/gdn_tuning.json (every row + the chosen tuning per length) and DIR/gdn_tuning.md;
`bench/kernels/gdn_kernels.py --tuning DIR/gdn_tuning.json` runs the side-by-side benchmark with it.
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import dataclasses
import datetime
import json
import multiprocessing
import sys
from pathlib import Path

from cuda_timing import capture, median_us  # this script's folder, bench/kernels, is on sys.path
import gdn_kernels as gk
from gdn_problems import QWEN36, ROTATIONS, TOLERANCE, Problem, make_problem, oracle, relative_error
from gdn_report import versions
import torch
import triton
import triton.language as tl

from hybridspec.kernels.gdn import triton as gdn

SWEEP_LENGTHS = (2, 3, 4, 6, 8, 12, 16)
COMMIT_M = (1, 8, 16)
L = QWEN36.layers


def verify_variants() -> list[gdn.VerifyTuning]:
    """Program shapes of the two verify kernels, every one with programmatic dependent launch:
    the recurrent kernel with one warp and 2, 4 or 8 value rows; the split kernel with 16 rows and
    2 warps, 32 or 64 rows and 4 warps, each also with k's copy after the outputs (`late_keys`,
    which matters with raw keys only, as the fold sweep runs it)."""
    V = gdn.VerifyTuning
    out = [V(method="recurrent", block_v=bv, num_warps=1) for bv in (2, 4, 8)]
    out += [V(method="split", block_v=bv, num_warps=w, late_keys=late) for bv, w in ((16, 2), (32, 4), (64, 4))
            for late in (False, True)]
    return out


def commit_variants() -> list[gdn.CommitTuning]:
    """The rank-1 loop (one load latency per committed token) and the one tensor-core product of
    all tokens' factors, every load issued at once."""
    C = gdn.CommitTuning
    loop = [C(method="loop", block_v=bv, num_warps=w) for bv in (16, 32) for w in (1, 2)]
    return loop + [C(method="dot", block_v=bv, num_warps=w) for bv, w in ((16, 2), (16, 4), (32, 4))]


@triton.jit
def _empty_kernel(x, N: tl.constexpr):
    if tl.program_id(0) == N:
        tl.store(x, 1.0)


# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Buffers:
    """One rotation: inputs of all layers, a state pool, round buffers."""

    p: Problem
    states: torch.Tensor  # [L, 1, HV, dv, dk]
    o: list[torch.Tensor]  # per layer [1, T, HV, dv], the last verify's outputs
    z: torch.Tensor  # [L, 1, 16, HV, dv]
    g_cum: torch.Tensor  # [L, 1, 16, HV]
    k: torch.Tensor  # [L, 1, 16, HK, dk] normalised k written by the gated verify


def buffers(T: int, dtype: torch.dtype, seed: int) -> Buffers:
    p = make_problem(QWEN36, T, dtype, seed, "cuda")
    _, _, _, HV, dv = p.v.shape
    return Buffers(p, p.state.clone(), [],
                   torch.zeros(L, 1, 16, HV, dv, device="cuda"), torch.zeros(L, 1, 16, HV, device="cuda"),
                   torch.zeros(L, 1, 16, *p.k.shape[3:], device="cuda"))


def verify_all(b: Buffers, T: int, tuning: gdn.VerifyTuning) -> None:
    """The runtime's call: raw a, b and q, k in, norms and gates in the kernel (gdn_verify_gated)."""
    p, table = b.p, gdn.SHIPPED.replace(verify={T: tuning})
    b.o = [gdn.gdn_verify_gated(p.q[layer], p.k[layer], p.v[layer], p.a[layer, None], p.b[layer, None],
                                p.A_log[layer], p.dt_bias[layer], b.states[layer], p.scale, z_out=b.z[layer, :, :T],
                                g_out=b.g_cum[layer, :, :T], k_out=b.k[layer, :, :T], tuning=table)[0]
           for layer in range(L)]


def commit_all(b: Buffers, T: int, accepted: torch.Tensor, tuning: gdn.CommitTuning) -> None:
    gdn.gdn_commit(b.states, b.z[:, :, :T], b.k[:, :, :T], b.g_cum[:, :, :T], accepted,
                   tuning=gdn.SHIPPED.replace(commit={T: tuning}))


def check(T: int, verify: gdn.VerifyTuning, commit: gdn.CommitTuning, m: int,
          dtype: torch.dtype = torch.float32) -> tuple[float, float]:
    """Relative errors (outputs, committed state) against float64 Eq. 1 from the same inputs
    (fp32, or bf16 as the model has them)."""
    b = buffers(T, dtype, seed=7)
    o_ref, s_ref = oracle(b.p, m)
    verify_all(b, T, verify)
    commit_all(b, T, torch.full((1,), m, dtype=torch.long, device="cuda"), commit)
    torch.cuda.synchronize()
    return relative_error(torch.stack(b.o)[:, 0], o_ref), relative_error(b.states[:, 0], s_ref)


def time_graph(rounds, samples: int, replays: int) -> float:
    graph = capture(rounds)
    result = median_us(graph, len(rounds), samples, replays)
    del graph
    return result


def _compile_worker(jobs: list[tuple[str, int, dict]]) -> int:
    """Run each variant once (compiling it into Triton's shared cache). A variant that does not
    compile is left out here; the timing loop meets the same error and reports it as its row."""
    done = 0
    for job in jobs:
        try:
            _compile_one(*job)
            done += 1
        except Exception as err:  # noqa: BLE001 -- reported again, with the row, by the timing loop
            print(f"compile failed: {job}: {type(err).__name__}: {str(err).splitlines()[-1][:200]}", flush=True)
    torch.cuda.synchronize()
    return done


def _compile_one(kind: str, T: int, fields: dict) -> None:
    for dtype in (torch.bfloat16, torch.float32):
        b = buffers(T, dtype, seed=1)
        if kind == "verify":
            verify_all(b, T, gdn.VerifyTuning(**fields))
        else:
            commit_all(b, T, torch.ones(1, dtype=torch.long, device="cuda"), gdn.CommitTuning(**fields))


def precompile(verify: list, commit: list, jobs: int) -> None:
    work = [("verify", T, dataclasses.asdict(v)) for T in SWEEP_LENGTHS for v in verify]
    work += [("commit", T, dataclasses.asdict(c)) for T in (2, 16) for c in commit]
    chunks = [work[i::jobs] for i in range(jobs)]
    ctx = multiprocessing.get_context("spawn")
    with futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        done = sum(pool.map(_compile_worker, chunks))
    print(f"compiled {done} variants with {jobs} processes", flush=True)


def main(argv=None) -> int:
    global SWEEP_LENGTHS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--lengths", type=lambda s: tuple(int(t) for t in s.split(",")), default=SWEEP_LENGTHS,
                        help="verify lengths T, comma-separated (default: all of SWEEP_LENGTHS)")
    parser.add_argument("--kinds", type=lambda s: set(s.split(",")), default=None,
                        help="only these verify kinds (variant_kind: e.g. split+pdl,recurrent+pdl)")
    parser.add_argument("--no-commit", action="store_true", help="leave the commit variants out")
    args = parser.parse_args(argv)
    gk.require_gpu()
    torch.backends.cuda.matmul.allow_tf32 = False
    SWEEP_LENGTHS = args.lengths
    verify, commit = verify_variants(), ([] if args.no_commit else commit_variants())
    if args.kinds:
        verify = [v for v in verify if variant_kind(dataclasses.asdict(v)) in args.kinds]
    precompile(verify, commit, args.jobs)
    rows: list[dict] = []

    # launch floor: 30 empty kernels (128 programs each) in one graph
    x = torch.zeros(1, device="cuda")
    launch = time_graph([lambda: [_empty_kernel[(128,)](x, N=1 << 20) for _ in range(L)]] * ROTATIONS,
                        args.samples, args.replays)
    rows.append(dict(kind="launch", T=None, tuning=None, median_us=round(launch, 2)))
    print(f"30 empty launches: {launch:.1f} us", flush=True)

    for T in SWEEP_LENGTHS:
        rot = [buffers(T, torch.bfloat16, seed=100 + r) for r in range(ROTATIONS)]
        for v in verify:
            row = dict(kind="verify", T=T, tuning=dataclasses.asdict(v), median_us=None)
            try:
                row["error_o"], row["error_s"] = check(T, v, gdn.SHIPPED.commit[T], m=T)
                row["error_o_bf16"], row["error_s_bf16"] = check(T, v, gdn.SHIPPED.commit[T], m=T, dtype=torch.bfloat16)
                row["passed"] = (max(row["error_o"], row["error_s"]) < TOLERANCE[torch.float32]
                                 and max(row["error_o_bf16"], row["error_s_bf16"]) < TOLERANCE[torch.bfloat16])
                row["median_us"] = round(time_graph([lambda b=b: verify_all(b, T, v) for b in rot],
                                                    args.samples, args.replays), 2)
            except Exception as error:  # a variant that does not compile or run is a row, not a crash
                row["error"] = gk.describe(error)
            rows.append(row)
            print(f"verify T={T:2d} {v}  {row.get('median_us')}  err={row.get('error_o', row.get('error'))}",
                  flush=True)
        del rot

    for T, ms in ((16, COMMIT_M), (2, (1, 2))):
        rot = [buffers(T, torch.bfloat16, seed=200 + r) for r in range(ROTATIONS)]
        for r in rot:
            verify_all(r, T, gdn.SHIPPED.verify[T])
        for c in commit:
            for m in ms:
                accepted = torch.full((1,), m, dtype=torch.long, device="cuda")
                row = dict(kind="commit", T=T, m=m, tuning=dataclasses.asdict(c), median_us=None)
                try:
                    row["error_o"], row["error_s"] = check(T, gdn.SHIPPED.verify[T], c, m=m)
                    row["passed"] = row["error_s"] < TOLERANCE[torch.float32]
                    row["median_us"] = round(time_graph([lambda b=b: commit_all(b, T, accepted, c) for b in rot],
                                                        args.samples, args.replays), 2)
                except Exception as error:
                    row["error"] = gk.describe(error)
                rows.append(row)
                print(f"commit T={T:2d} m={m:2d} {c}  {row.get('median_us')}  err={row.get('error_s', row.get('error'))}",
                      flush=True)
        del rot

    chosen = choose(rows)
    result = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                  versions=versions(), command=" ".join(sys.argv),
                  launch_floor_us=launch, chosen=chosen, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gdn_tuning.json").write_text(json.dumps(result, indent=2))
    (args.out / "gdn_tuning.md").write_text(summary(result))
    print("\n" + summary(result))
    return 0


def choose(rows: list[dict]) -> dict:
    """Fastest passing verify variant per T; fastest passing commit variant by total over its m."""
    out: dict = {"verify": {}, "commit": None}
    for T in SWEEP_LENGTHS:
        ok = [r for r in rows if r["kind"] == "verify" and r["T"] == T and r.get("passed") and r["median_us"]]
        if ok:
            best = min(ok, key=lambda r: r["median_us"])
            out["verify"][str(T)] = dict(best["tuning"], median_us=best["median_us"])
    totals: dict[str, list[float]] = {}
    for r in rows:
        if r["kind"] == "commit" and r.get("passed") and r["median_us"] and r["T"] == 16:
            totals.setdefault(json.dumps(r["tuning"], sort_keys=True), []).append(r["median_us"])
    full = {k: v for k, v in totals.items() if len(v) == len(COMMIT_M)}
    if full:
        key = min(full, key=lambda k: sum(full[k]))
        out["commit"] = dict(json.loads(key), median_us_by_m=dict(zip(map(str, COMMIT_M), full[key])))
    return out


def variant_kind(tuning: dict) -> str:
    """recurrent or split, +pdl, +late_keys: the columns of the summary."""
    kind = tuning["method"] + ("+pdl" if tuning.get("pdl") else "")
    return kind + ("+late_keys" if tuning.get("late_keys") else "")


def summary(result: dict) -> str:
    lines = [f"# GDN kernel tuning on {result['device']}", "",
             f"date: {result.get('date')}  \ncommand: `{result['command']}`  \nversions: {json.dumps(result['versions'])}",
             "", f"30 empty launches in a graph: "
             f"{result['launch_floor_us']:.1f} us", "",
             "| T | method | block_v | warps | pdl | late_keys | verify 30 layers (us) |",
             "|---|---|---|---|---|---|---|"]
    for T, t in result["chosen"]["verify"].items():
        lines.append(f"| {T} | {t['method']} | {t['block_v']} | {t['num_warps']} | {t.get('pdl', False)} | "
                     f"{t.get('late_keys', False)} | {t['median_us']} |")
    verify_rows = [r for r in result["rows"] if r["kind"] == "verify"]
    kinds = list(dict.fromkeys(variant_kind(r["tuning"]) for r in verify_rows))
    lines += ["", "Fastest passing variant of each kind (verify, 30 layers, us):", "",
              "| T | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for T in SWEEP_LENGTHS:
        cells = []
        for kind in kinds:
            times = [r["median_us"] for r in verify_rows if r["T"] == T and r.get("passed") and r["median_us"]
                     and variant_kind(r["tuning"]) == kind]
            cells.append(f"{min(times):.1f}" if times else "-")
        lines.append(f"| {T} | " + " | ".join(cells) + " |")
    c = result["chosen"]["commit"]
    if c:
        lines += ["", f"commit (all 30 layers, T = 16): {c.get('method', 'loop')}, block_v {c['block_v']}, "
                  f"warps {c['num_warps']}: "
                  + ", ".join(f"m={m}: {us} us" for m, us in c["median_us_by_m"].items())]
    failed = [r for r in result["rows"] if r["kind"] != "launch" and not r.get("passed")]
    lines += ["", f"variants failing or erroring: {len(failed)}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
