"""Where a round's time goes: HybridSpec's verify + commit of bench/gdn_kernels.py taken apart.

    python bench/gdn_round_parts.py [--tuning DIR/gdn_tuning.json] [--widths 2,8,16] [--out DIR]

Same setting, inputs, rotation and timing as bench/gdn_kernels.py (30 GDN layers of Qwen3.6-35B-A3B,
bf16 inputs, fp32 states, m = w). Per w, each row is one CUDA graph of the ROTATIONS rounds:
  round            30 x gdn_verify_gated + gdn_commit, as the benchmark's hybridspec_commit row (the
                   commit a launch of its own, normalised fp32 keys)
  verify           the 30 verify launches alone, on fresh states S_0
  verify-evolved   the same after 200 replays of the full round (states committed again and again)
  commit           the commit alone
  round-no-pdl     the round with programmatic dependent launch off in both kernels
  round-loop       the round with the commit's rank-1 loop (CommitTuning(16, 1)) at every length
The sum verify + commit against round says whether the two kernels slow each other down.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gdn_kernels as gk  # noqa: E402

from hybridspec.kernels.gdn import triton as gdn  # noqa: E402


def timed(parts: list[gk.HybridSpecCommit], method: str, samples: int, replays: int) -> float:
    graph = gk.capture([getattr(x, method) for x in parts])
    result = gk.median_us(graph, len(parts), samples, replays)
    del graph
    return result


def measure(w: int, samples: int, replays: int) -> dict[str, float]:
    problems = [gk.make_problem(gk.QWEN36, w, torch.bfloat16, 1000 + r, "cuda") for r in range(gk.ROTATIONS)]
    row: dict[str, float] = {}
    parts = [gk.HybridSpecCommit(p, w, w) for p in problems]
    for x in parts:
        x.verify()  # round buffers filled for the commit-only graph
    row["verify"] = timed(parts, "verify", samples, replays)
    row["commit"] = timed(parts, "commit", samples, replays)
    parts = [gk.HybridSpecCommit(p, w, w) for p in problems]
    row["round"] = timed(parts, "round", samples, replays)
    graph = gk.capture([x.round for x in parts])
    for _ in range(200):
        graph.replay()
    torch.cuda.synchronize()
    del graph
    row["verify-evolved"] = timed(parts, "verify", samples, replays)
    saved = dict(gdn.VERIFY_TUNING), dict(gdn.COMMIT_TUNING)
    try:
        gdn.VERIFY_TUNING.update({T: dataclasses.replace(t, pdl=False) for T, t in gdn.VERIFY_TUNING.items()})
        gdn.COMMIT_TUNING.update({T: dataclasses.replace(t, pdl=False) for T, t in gdn.COMMIT_TUNING.items()})
        row["round-no-pdl"] = timed([gk.HybridSpecCommit(p, w, w) for p in problems], "round", samples, replays)
        gdn.VERIFY_TUNING.update(saved[0])
        gdn.COMMIT_TUNING.update({T: gdn.CommitTuning(16, 1) for T in gdn.COMMIT_TUNING})
        row["round-loop"] = timed([gk.HybridSpecCommit(p, w, w) for p in problems], "round", samples, replays)
    finally:
        gdn.VERIFY_TUNING.update(saved[0])
        gdn.COMMIT_TUNING.update(saved[1])
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
    if args.tuning:
        gk.apply_tuning(json.loads(args.tuning.read_text())["chosen"])
    rows = {}
    for w in map(int, args.widths.split(",")):
        rows[w] = measure(w, args.samples, args.replays)
        print(f"w={w:2d} " + "  ".join(f"{k} {v}" for k, v in rows[w].items()), flush=True)
    names = list(next(iter(rows.values())))
    table = ["| w | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    table += [f"| {w} | " + " | ".join(f"{r[n]:.1f}" for n in names) + " |" for w, r in rows.items()]
    print("\n".join(table))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        result = dict(device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
                      command=" ".join(sys.argv), versions=gk.versions(), rows=rows)
        (args.out / "gdn_round_parts.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
