"""GDN verification + commit on one GPU: HybridSpec's Triton kernels against SGLang's and fla's.

    python bench/kernels/gdn_kernels.py --out DIR [--samples 30] [--replays 10] [--quick]
    python bench/kernels/gdn_kernels.py --from-log LOG --bandwidth-from OLD.json --out DIR   # no GPU

Setting: the 30 GDN layers of Qwen3.6-35B-A3B (32 value heads, 16 key heads, dk = dv = 128),
fp32 states, bf16 projections, batch 1; verification widths w in {2, 3, 4, 6, 8, 12, 16} and
committed lengths m = w and m = ceil(w / 2). One round = verify all 30 layers (one call per layer,
as the model does) + commit the accepted state of every layer.

Implementations, each with its native state layout (all four keep S as [HV, dv, dk] with dk
contiguous, so no conversion is needed anywhere):
  hybridspec            what the runtime runs: 30 x `gdn_verify_gated(pending=...)`, each launch first
                        applying the previous round's commit (Eq. 7) to its rows of the state, then
                        verifying (compact factors into the other of two round-buffer slots: z / |k|
                        fp32, g_cum fp32 and the raw bf16 k, `raw_keys`); the commit is deferred
                        to the next round's verification, not skipped: every round reads and
                        writes every state once
  hybridspec_commit     30 x `gdn_verify_gated` (compact factors with the normalised fp32 k into
                        round buffers) + 1 `gdn_commit` launch of its own
  sglang_default        30 x `fused_sigmoid_gating_delta_rule_update` writing the per-token state
                        buffer (`intermediate_states_buffer`, cache_steps = w), then SGLang's
                        `fused_mamba_state_scatter_with_mask` copying step m-1 into the pool
  sglang_replayssm      30 x `gdn_replayssm_spec_decode` (launch_mode="verify", circular ring of
                        16 steps, SGLang's default) + `commit_gdn_replayssm_spec` (cursor advance)
                        + `commit_gdn_replayssm_circular` (folds into the pool when the ring fills)
                        -- what SGLang 0.5.23 runs for GDN under --enable-linear-replayssm-spec
  sglang_replayssm_fold 30 x the default kernel with `cache_ring=True` (raw k, v, g, beta ring) +
                        `commit_gdn_replayssm_fold_all_layers` (gdn_replayssm_spec_fold.py)
  fla_chunk             30 x fla `chunk_gated_delta_rule` over w tokens, then 30 x over the first
                        m tokens with output_final_state=True, copied into the state pool
  floor                 bytes that must move / device-to-device copy bandwidth of this run
SGLang's kernels and ours form g and beta from the raw gate inputs (a, b, A_log, dt_bias) and
L2-normalise q and k themselves inside the timed region (SGLang: use_qk_l2norm_in_kernel=True, as
SGLang calls them; ours: `gdn_verify_gated`, as the runtime calls it). fla takes normalised q, k
and precomputed fp32 g, beta (its gating is outside the timed region).

Timing: per (impl, w, m) ONE CUDA graph holding ROTATIONS = 4 rounds, each on its own input set
and its own state pool (so consecutive rounds touch different memory: the 30 layers' states are
63 MB in fp32, above the H200's 60 MB L2); median over --samples samples of --replays replays,
timed with CUDA events, reported per round. States evolve from round to round (every round
commits), as in decoding; SGLang ReplaySSM's ring cursors advance too, so its periodic folds are
amortised as in serving.

Correctness (printed before any timing; exit status 1 if ours fails): outputs and committed
states of every implementation against Eq. 1 run token by token in float64 on the GPU (the
project's reference computes in fp32 internally, so the oracle is written here), relative
Frobenius error; ours must stay below 1e-5 with fp32 inputs and below 5e-3 with bf16 inputs.

Floor: per round, read S_0 of all layers and write S_m of all layers,
    2 x 30 x 32 x 128 x 128 x 4 B = 125,829,120 B,
plus every layer's inputs and outputs, per token 24,704 B (q, k: 16 x 128 x 2 B each; v and o:
32 x 128 x 2 B each; a, b: 32 x 2 B each), i.e. 741,120 B per token over 30 layers:
    w = 2: 127.3 MB -> 30.3 us,   w = 16: 137.7 MB -> 32.8 us   at 4.2 TB/s (DESIGN C).

Preparation (`.baselines` is git-ignored; the GPU machine has no registry):
    bash ../shared/tools/gdn-baselines.sh        # on a machine with PyPI; copy .baselines over
    python3 -m pip install -q --no-index --no-deps --target .baselines/site .baselines/wheels/*.whl
A baseline that fails to import or run is reported as a row with its error, not a crash.
A run stopped by a time cap before its report leaves every measured row in its log (stdout):
`--from-log` writes the report from it, the unfinished rows marked as not measured.

Beside it: gdn_problems.py (the setting, inputs, oracle and floor), gdn_impls.py (the
implementations and the baselines' loading), gdn_report.py (the tables and the report).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Callable

import torch
from cuda_timing import capture, copy_bandwidth, median_us
from gdn_impls import IMPLS, prepare_baselines
from gdn_problems import QWEN36, ROTATIONS, TOLERANCE, Problem, Setting, floor_us, make_problem, oracle, relative_error
from gdn_report import correctness_table, report_from_log, timing_table, verification_memory, versions, write_report
from torch import Tensor

WIDTHS = (2, 3, 4, 6, 8, 12, 16)


# ---------------------------------------------------------------------------------------------
# Phase 1: correctness
# ---------------------------------------------------------------------------------------------


def check_one(name: str | Callable, p: Problem, w: int, m: int, o_ref: Tensor, s_ref: Tensor) -> dict:
    """One round against the oracle; for ours (`HybridSpec`, whose commit is folded into the next
    round) a second round on the same inputs too, from the first's committed state: its outputs and
    state against the oracle run from s_ref; the worse of the two rounds is reported. name: a key of
    IMPLS or an implementation's constructor (e.g. `HybridSpec` with other launch parameters)."""
    impl = (IMPLS[name] if isinstance(name, str) else name)(p, w, m)
    impl.round()
    o_err = relative_error(impl.outputs(), o_ref)
    if getattr(impl, "rounds_per_cycle", 1) == 1:
        return dict(o_err=o_err, state_err=relative_error(impl.committed(), s_ref))
    impl.round()  # folds the first round's commit
    o_ref2, s_ref2 = oracle(dataclasses.replace(p, state=s_ref.float()[:, None]), m)
    return dict(o_err=max(o_err, relative_error(impl.outputs(), o_ref2)),
                state_err=relative_error(impl.committed(), s_ref2))


def check_correctness(setting: Setting, configs, impls: dict[str, Callable], device) -> list[dict]:
    """Every implementation (name -> constructor) against the oracle at every (w, m), fp32 and bf16."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for w, m in configs:
            p = make_problem(setting, w, dtype, seed=w, device=device)
            o_ref, s_ref = oracle(p, m)
            for name, make in impls.items():
                row = dict(impl=name, dtype=str(dtype).removeprefix("torch."), w=w, m=m)
                try:
                    row.update(check_one(make, p, w, m, o_ref, s_ref))
                    row["passed"] = max(row["o_err"], row["state_err"]) < TOLERANCE[dtype]
                except Exception as error:  # a broken baseline is a row, not a crash
                    row["error"] = describe(error)
                rows.append(row)
    return rows


def describe(error: Exception) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{type(error).__name__}: {error} ({Path(frame.filename).name}:{frame.lineno})"[:400]


# ---------------------------------------------------------------------------------------------
# Phase 2: timing
# ---------------------------------------------------------------------------------------------


def time_impl(name: str | Callable, problems: list[Problem], w: int, m: int, samples: int, replays: int) -> float:
    """Median us per round of one CUDA graph of ROTATIONS rounds (name as in `check_one`)."""
    make = IMPLS[name] if isinstance(name, str) else name
    impls = [make(p, w, m) for p in problems]
    cycle = getattr(impls[0], "rounds_per_cycle", 1)  # rounds until an input set's buffers repeat
    graph = capture([impl.round for impl in impls] * cycle)
    result = median_us(graph, len(impls) * cycle, samples, replays)
    del graph, impls
    torch.cuda.empty_cache()
    return result


def run_timing(setting: Setting, configs, impls: dict[str, Callable], samples: int, replays: int,
               bandwidth: float) -> list[dict]:
    rows = []
    for w, m in configs:
        problems = [make_problem(setting, w, torch.bfloat16, seed=1000 + r, device="cuda")
                    for r in range(ROTATIONS)]
        for name, make in impls.items():
            row = dict(impl=name, w=w, m=m, median_us=None)
            try:
                row["median_us"] = round(time_impl(make, problems, w, m, samples, replays), 2)
            except Exception as error:
                row["error"] = describe(error)
            print(f"  {name:22s} w={w:2d} m={m:2d}  {row['median_us'] or row.get('error')}", flush=True)
            rows.append(row)
        rows.append(dict(impl="floor", w=w, m=m, median_us=round(floor_us(setting, w, bandwidth), 2)))
    return rows


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for gdn_kernels.json/.md")
    parser.add_argument("--samples", type=int, default=30, help="timed samples per configuration")
    parser.add_argument("--replays", type=int, default=10, help="graph replays per sample")
    parser.add_argument("--quick", action="store_true", help="smoke run: w in {2, 16}, m = w, few samples")
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    parser.add_argument("--widths", help="comma-separated subset of w (default: " + ",".join(map(str, WIDTHS)) + ")")
    parser.add_argument("--tuning", type=Path,
                        help="gdn_tuning.json of bench/kernels/gdn_tuning.py: launch ours with its choice")
    parser.add_argument("--from-log", type=Path, help="write the report from the log of a run stopped before it "
                        "wrote one (no GPU): its printed rows, the unprinted ones as not measured")
    parser.add_argument("--bandwidth-from", type=Path, help="with --from-log: the gdn_kernels.json whose copy "
                        "bandwidth, device and versions to take (older logs have none of them)")
    parser.add_argument("--no-sglang-pdl", action="store_true",
                        help="launch SGLang's kernels without programmatic dependent launch (SGLang uses it on SM90+)")
    return parser.parse_args(argv)


def tuning_from_sweep(chosen: dict):
    """The shipped launch table with the per-length verify choice of bench/kernels/gdn_tuning.py
    and its one commit choice at every window length (the sweep times the commit alone)."""
    from hybridspec.kernels.gdn import triton as gdn

    def build(cls, row: dict):
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row})

    verify = {int(T): build(gdn.VerifyTuning, t) for T, t in chosen["verify"].items()}
    commit = {T: build(gdn.CommitTuning, chosen["commit"]) for T in gdn.SHIPPED.commit} if chosen.get("commit") else {}
    tuning = gdn.SHIPPED.replace(verify=verify, commit=commit)
    print(f"tuning: verify {dict(tuning.verify)}, commit {dict(tuning.commit)}", flush=True)
    return tuning


def configurations(quick: bool, widths: str | None = None) -> list[tuple[int, int]]:
    if quick:
        return [(2, 2), (16, 16)]
    chosen = WIDTHS if widths is None else tuple(int(w) for w in widths.split(","))
    if unknown := sorted(set(chosen) - set(WIDTHS)):
        sys.exit(f"--widths: {unknown} not among {list(WIDTHS)}")
    return [(w, m) for w in chosen for m in dict.fromkeys((w, math.ceil(w / 2)))]


def require_gpu() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/kernels/gdn_kernels.py measures GPU kernels and needs CUDA; no CUDA device here, "
                 "nothing was run.")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("TRITON_INTERPRET is set: the kernels would be interpreted, not timed. Unset it.")


@torch.no_grad()
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_log:
        return report_from_log(args.from_log, args.bandwidth_from, args.out)
    require_gpu()
    impls = [name for name in args.impls.split(",") if name]
    unknown = [name for name in impls if name not in IMPLS]
    if unknown or "hybridspec" not in impls:
        sys.exit(f"--impls must include hybridspec and name only {list(IMPLS)}; got {impls}")
    prepare_baselines(torch.cuda.get_device_capability(), pdl=not args.no_sglang_pdl)
    makers = {name: IMPLS[name] for name in impls}
    if args.tuning:
        tuning = tuning_from_sweep(json.loads(args.tuning.read_text())["chosen"])
        makers.update({name: functools.partial(IMPLS[name], tuning=tuning) for name in impls
                       if name.startswith("hybridspec")})
    samples, replays = (5, 3) if args.quick else (args.samples, args.replays)
    configs = configurations(args.quick, args.widths)

    command = " ".join([Path(sys.executable).name, *sys.argv])
    print(f"command {command}\ndevice {torch.cuda.get_device_name()}; versions {json.dumps(versions())}", flush=True)
    print("Phase 1: correctness against float64 Eq. 1 (all 30 layers)", flush=True)
    correctness = check_correctness(QWEN36, configs, makers, "cuda")
    print(correctness_table(correctness), flush=True)
    ours = [r for r in correctness if r["impl"] == "hybridspec"]
    if not all(r.get("passed") for r in ours):
        print("hybridspec FAILED the correctness check: no timing run.", file=sys.stderr)
        return 1

    print(f"\nPhase 2: timing ({samples} samples x {replays} replays x {ROTATIONS} rounds)", flush=True)
    bandwidth = copy_bandwidth(samples=20)
    print(f"  copy bandwidth (read + write) {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows = run_timing(QWEN36, configs, makers, samples, replays, bandwidth)
    result = dict(
        device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
        command=command, versions=versions(),
        copy_bandwidth_GBps=bandwidth / 1e9, memory_bytes=verification_memory(QWEN36), rows=rows,
        correctness=correctness,
        tuning=(json.loads(args.tuning.read_text())["chosen"] if args.tuning
                else "hybridspec.kernels.gdn.tuning.SHIPPED"),
    )
    write_report(args.out, result)
    print("\n" + timing_table(rows))
    print(f"\nwrote {args.out / 'gdn_kernels.json'} and {args.out / 'gdn_kernels.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
