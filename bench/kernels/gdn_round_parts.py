"""Where a round's time goes: HybridSpec's verify + commit of bench/kernels/gdn_kernels.py taken apart.

    python bench/kernels/gdn_round_parts.py [--tuning DIR/gdn_tuning.json] [--widths 2,8,16] [--out DIR]

Same setting, inputs, rotation and timing as bench/kernels/gdn_kernels.py (30 GDN layers of Qwen3.6-35B-A3B,
bf16 inputs, fp32 states, m = w). Per w, each row is one CUDA graph of the ROTATIONS rounds:
  round            30 x gdn_verify_gated + gdn_commit, as the benchmark's hybridspec_commit row (the
                   commit a launch of its own, normalised fp32 keys)
  verify           the 30 verify launches alone, on fresh states S_0
  verify-evolved   the same after 200 replays of the full round (states committed again and again)
  commit           the commit alone
  round-no-pdl     the round with programmatic dependent launch off in both kernels
  round-loop       the round with the commit's rank-1 loop (16 rows, one warp) at every length
The sum verify + commit against round says whether the two kernels slow each other down.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

from cuda_timing import capture, median_us  # this script's folder, bench/kernels, is on sys.path
from gdn_impls import HybridSpecCommit
import gdn_kernels as gk
from gdn_problems import QWEN36, ROTATIONS, make_problem
from gdn_report import versions
import torch

from hybridspec.kernels.gdn import triton as gdn
from hybridspec.kernels.gdn.tuning import COMMIT_LOOP


def timed(parts: list[HybridSpecCommit], method: str, samples: int, replays: int) -> float:
    graph = capture([getattr(x, method) for x in parts])
    result = median_us(graph, len(parts), samples, replays)
    del graph
    return result


def measure(w: int, samples: int, replays: int, tuning: gdn.Tuning) -> dict[str, float]:
    problems = [make_problem(QWEN36, w, torch.bfloat16, 1000 + r, "cuda") for r in range(ROTATIONS)]
    row: dict[str, float] = {}
    parts = [HybridSpecCommit(p, w, w, tuning=tuning) for p in problems]
    for x in parts:
        x.verify()  # round buffers filled for the commit-only graph
    row["verify"] = timed(parts, "verify", samples, replays)
    row["commit"] = timed(parts, "commit", samples, replays)
    parts = [HybridSpecCommit(p, w, w, tuning=tuning) for p in problems]
    row["round"] = timed(parts, "round", samples, replays)
    graph = capture([x.round for x in parts])
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    del graph
    row["verify-evolved"] = timed(parts, "verify", samples, replays)
    no_pdl = tuning.replace(verify={T: dataclasses.replace(t, pdl=False) for T, t in tuning.verify.items()})
    row["round-no-pdl"] = timed([HybridSpecCommit(p, w, w, tuning=no_pdl) for p in problems], "round", samples,
                                replays)
    loop = tuning.replace(commit={T: COMMIT_LOOP for T in tuning.commit})
    row["round-loop"] = timed([HybridSpecCommit(p, w, w, tuning=loop) for p in problems], "round", samples, replays)
    row["verify + commit"] = row["verify"] + row["commit"]
    return {k: round(v, 2) for k, v in row.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuning", type=Path)
    parser.add_argument("--widths", default="2,8,16")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    gk.require_gpu()
    tuning = gk.tuning_from_sweep(json.loads(args.tuning.read_text())["chosen"]) if args.tuning else gdn.SHIPPED
    rows = {}
    for w in map(int, args.widths.split(",")):
        rows[w] = measure(w, args.samples, args.replays, tuning)
        print(f"w={w:2d} " + "  ".join(f"{k} {v}" for k, v in rows[w].items()), flush=True)
    names = list(next(iter(rows.values())))
    table = ["| w | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    table += [f"| {w} | " + " | ".join(f"{r[n]:.1f}" for n in names) + " |" for w, r in rows.items()]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                      command=" ".join(sys.argv), versions=versions(), rows=rows)
        (args.out / "gdn_round_parts.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
