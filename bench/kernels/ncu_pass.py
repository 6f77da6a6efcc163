"""Nsight Compute's view of every kernel of one verification pass of the 35B preset (random weights,
bf16, Triton backend), for the question the round's timings cannot answer: where inside each
kernel the time over its bytes goes (DRAM throughput against peak, achieved occupancy, the warp
stall reasons, registers, grid).

Two halves:
- `run --width W [--layers N]`: loads the preset (its first N layers, default 8: every kernel shape
  of the whole model, with few enough launches for ncu's replays), prefills a random context, warms
  the pass of W tokens, then runs one eager pass between `cudaProfilerStart` and `cudaProfilerStop`, so that
  `ncu --profile-from-start off` profiles that pass's kernels only (one report per width, so that
  each kernel's rows are of one call size);
- `summary CSV [--raw RAW]`: reads `ncu --page details --csv` and prints, per kernel name, calls,
  mean duration, DRAM and memory throughput, achieved occupancy, registers, grid and block, and
  from `--page raw --csv` the DRAM bytes moved (and so the achieved TB/s, to set against the copy
  bandwidth) and the four largest warp stall reasons (warps stalled per issued instruction), as a
  table (and JSON beside it).

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \\
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --metrics dram__bytes_read.sum,dram__bytes_write.sum,smsp__average_warps_issue_stalled_wait_... \\
        -o OUT/pass -f python3 bench/kernels/ncu_pass.py run --width 1
    ncu -i OUT/pass.ncu-rep --page details --csv > OUT/pass.csv
    ncu -i OUT/pass.ncu-rep --page raw --csv > OUT/pass_raw.csv
    python3 bench/kernels/ncu_pass.py summary OUT/pass.csv --raw OUT/pass_raw.csv --out OUT/ncu_summary.json

(`bench/device_round.sh OUT ncu` runs this for w = 1 and w = 4 with every stall reason's metric.)

ncu replays each kernel with its caches flushed (`--cache-control all`, the default), so every
kernel reads its weights from DRAM as it does in a decoding pass, but without the overlap of
programmatic dependent launch: durations here are each kernel alone.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# metric name on the details page (as ncu prints it) → the field it is kept as, per launch
KEPT = {
    "Duration": "duration",
    "DRAM Throughput": "dram_pct",
    "Memory Throughput": "memory_pct",
    "Compute (SM) Throughput": "sm_pct",
    "Achieved Occupancy": "occupancy_pct",
    "Registers Per Thread": "registers",
    "Grid Size": "grid",
    "Block Size": "block",
    "Dynamic Shared Memory Per Block": "dynamic_smem",
    "Static Shared Memory Per Block": "static_smem",
    "Warp Cycles Per Issued Instruction": "cycles_per_issue",
}
TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
PERCENT = {"dram_pct", "memory_pct", "sm_pct", "occupancy_pct"}  # taken only from rows in % (the memory
# section prints another "Memory Throughput" in bytes per second)


def run(args) -> int:
    import torch

    from hybridspec.runtime.presets import PRESETS
    from hybridspec.runtime.session import open_session
    from tests.runtime.helpers import prefilled_cache

    w = args.width
    if args.layers:  # the first N layers: every kernel shape of the full model at a fraction of the load
        # time, and few enough launches that ncu's per-kernel replays finish inside one device call
        if args.model not in PRESETS:
            print(f"ncu_pass run: --layers cuts a preset; {args.model!r} is not one (give --layers 0)", file=sys.stderr)
            return 2
        layers = PRESETS[args.model]["num_hidden_layers"]
        if not 1 <= args.layers <= layers:
            print(f"ncu_pass run: --layers {args.layers} outside 1..{layers} ({args.model})", file=sys.stderr)
            return 2
        PRESETS[args.model] = {**PRESETS[args.model], "num_hidden_layers": args.layers}
    session = open_session(args.model, "random", device="cuda", dtype="bfloat16", backend="triton",
                           max_context=args.context + 4 * w)
    target = session.target
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, target.cfg.vocab_size, (args.context,), generator=gen).tolist()
    cache = prefilled_cache(target, prompt, w)
    block = torch.randint(0, target.cfg.vocab_size, (1, w), generator=gen).cuda()
    for _ in range(2):  # compile and warm before the profiled region
        cache.pending = [True] * len(cache.pending)
        target.forward_pass(block, cache)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    cache.pending = [True] * len(cache.pending)
    target.forward_pass(block, cache)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"profiled one pass of w = {w}")
    return 0


def _number(text: str):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return text


def _rows(path: Path) -> list[dict]:
    """The CSV table of an ncu page: from its header line (ncu may print notes before it) to the end,
    quoted fields spanning lines included."""
    text = path.read_text()
    start = text.find('"ID"')
    if start < 0:
        raise ValueError(f"{path}: no ncu CSV table (no header line starting with \"ID\")")
    return list(csv.DictReader(io.StringIO(text[start:], newline="")))


STALL = "smsp__average_warps_issue_stalled_"  # raw metrics: warps stalled per issued instruction, by reason
STALL_END = "_per_issue_active.ratio"


BYTES = ("dram__bytes_read.sum", "dram__bytes_write.sum")  # raw metrics: DRAM traffic of the launch
TO_MB = {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3}


def read_raw(path: Path) -> dict[str, dict]:
    """launch ID → {"stalls": {reason: warps stalled per issued instruction}, "dram_mb": bytes read
    and written in MB} from `--page raw --csv` (one row per launch; the row after the header holds
    the units)."""
    rows = _rows(path)
    units = next((row for row in rows if not row.get("ID", "").strip().isdigit()), {})
    raw = {}
    for row in rows:
        if not row.get("ID", "").strip().isdigit():
            continue
        stalls = {name[len(STALL):-len(STALL_END)]: _number(value) for name, value in row.items()
                  if name and name.startswith(STALL) and name.endswith(STALL_END)
                  and name != f"{STALL}selected{STALL_END}"}  # issuing, not a stall
        launch = {"stalls": stalls}
        traffic = [_number(row[m]) * TO_MB.get(units.get(m, "").strip(), float("nan")) for m in BYTES if m in row]
        if traffic and all(isinstance(t, float) for t in traffic):
            launch["dram_mb"] = sum(traffic)
        raw[row["ID"]] = launch
    return raw


def read_details(path: Path, raw: dict[str, dict] | None = None) -> dict[str, list[dict]]:
    """kernel name → one dict per profiled launch: the KEPT metrics, plus `stalls` (reason → warps
    stalled per issued instruction) and `dram_mb` from `read_raw` where given."""
    launches: dict[tuple[str, str], dict] = {}
    for row in _rows(path):
        key = (row["ID"], row["Kernel Name"])
        launch = launches.setdefault(key, {"stalls": {}, **(raw or {}).get(row["ID"], {})})
        name, value = row["Metric Name"], _number(row["Metric Value"])
        unit = row.get("Metric Unit", "")
        if name in KEPT and (KEPT[name] not in PERCENT or unit == "%"):
            if name == "Duration":  # µs whatever unit ncu chose
                value = value * TO_US.get(unit, 1.0)
            launch[KEPT[name]] = value
    by_kernel: dict[str, list[dict]] = defaultdict(list)
    for (_, kernel), launch in launches.items():
        by_kernel[kernel].append(launch)
    return by_kernel


def summarise(by_kernel: dict[str, list[dict]]) -> list[dict]:
    rows = []
    for kernel, launches in by_kernel.items():
        durations = [l["duration"] for l in launches if isinstance(l.get("duration"), float)]
        row = dict(kernel=kernel[:80], calls=len(launches),
                   us=round(statistics.mean(durations), 2) if durations else None,
                   total_us=round(sum(durations), 1))
        for field in ("dram_mb", "dram_pct", "memory_pct", "sm_pct", "occupancy_pct", "registers", "grid", "block",
                      "dynamic_smem", "static_smem", "cycles_per_issue"):
            values = [l[field] for l in launches if field in l]
            if values:
                row[field] = round(statistics.mean(values), 3 if field == "dram_mb" else 1) \
                    if isinstance(values[0], float) else values[0]
        if row.get("dram_mb") is not None and row["us"]:
            row["tb_per_s"] = round(row["dram_mb"] / row["us"], 3)  # MB per µs = TB/s: against the copy bandwidth
        stalls: dict[str, list[float]] = defaultdict(list)
        for launch in launches:
            for reason, value in launch["stalls"].items():
                if isinstance(value, float):
                    stalls[reason].append(value)
        row["stalls"] = dict(sorted(((r, round(statistics.mean(v), 2)) for r, v in stalls.items()),
                                    key=lambda item: -item[1])[:4])
        rows.append(row)
    return sorted(rows, key=lambda r: -(r["total_us"] or 0))


def summary(args) -> int:
    rows = summarise(read_details(Path(args.csv), read_raw(Path(args.raw)) if args.raw else None))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print("| kernel | calls | µs | total µs | DRAM MB | TB/s | DRAM % | mem % | SM % | occupancy % | regs | grid |"
          " block | cycles/issue | top stalls |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        stalls = "; ".join(f"{k} {v}" for k, v in r["stalls"].items())
        print(f"| {r['kernel']} | {r['calls']} | {r['us']} | {r['total_us']} | {r.get('dram_mb', '')} |"
              f" {r.get('tb_per_s', '')} | {r.get('dram_pct', '')} |"
              f" {r.get('memory_pct', '')} | {r.get('sm_pct', '')} | {r.get('occupancy_pct', '')} |"
              f" {r.get('registers', '')} | {r.get('grid', '')} | {r.get('block', '')} |"
              f" {r.get('cycles_per_issue', '')} | {stalls} |")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one eager pass of --width tokens inside the profiled region (under ncu)")
    r.add_argument("--model", default="qwen3.6-35b-a3b")
    r.add_argument("--width", type=int, default=1, help="tokens in the profiled pass")
    r.add_argument("--context", type=int, default=1024)
    r.add_argument("--layers", type=int, default=8,
                   help="keep the preset's first N layers (every fourth is attention); 0: all of them")
    s = sub.add_parser("summary", help="a table per kernel name from `ncu --page details --csv`")
    s.add_argument("csv")
    s.add_argument("--raw", default=None, help="`ncu --page raw --csv` of the same report (the stall reasons)")
    s.add_argument("--out", default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    try:
        return summary(args)
    except (OSError, ValueError) as error:  # a missing page, or one with no table (ncu failed)
        print(f"ncu_pass summary: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
