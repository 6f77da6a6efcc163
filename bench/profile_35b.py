"""Cost profile of a target's verification pass by module (the paper's Table 4 and Figure 1b).

For each verification length w: the GPU kernel time of one eager pass of w tokens after a prefill
of the context, attributed to the module that launched each kernel — the GDN token mixers, the
softmax-attention token mixers, the MoE blocks (router, routed and shared experts) and everything
else (embedding, norms between blocks, LM head) — plus the drafter's pass (context extension and
one block proposal). Attribution: each module's calls run inside a profiler range; a kernel belongs
to the range whose GPU-side span contains its start (`gpu_user_annotation` events), and to `other`
outside every range. The graph-timed latency of each w is reported beside it.

Then the correlation the paper reports (0.999): over `--calls` verification calls of random token
blocks at every w, the CUDA-graph latency against the number of distinct (layer, expert) pairs the
call routes to, with the least-squares line (intercept, µs per distinct pair).

    python3 bench/profile_35b.py --out DIR [--model qwen3.6-35b-a3b] [--context 1024]

Writes DIR/profile_35b.json ({"device", "date", "versions", "command", "profile": [...],
"drafter": {...}, "calls": [...], "correlation": {...}}) and DIR/profile_35b.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.kernels.cuda_timing import median_us  # noqa: E402
from hybridspec.collectors.profile import PARTS, WIDTHS, distinct_pairs, module_ranges  # noqa: E402
from hybridspec.runtime.session import open_session  # noqa: E402
from hybridspec.workbench.profiling import part_times, profile_calls, ranged  # noqa: E402
from tests.runtime.helpers import captured_pass, prefilled_cache  # noqa: E402



def log(line: str) -> None:
    print(line, flush=True)


def profile_pass(run, reps: int = 5):
    return part_times(profile_calls(run, reps, torch.device("cuda")), PARTS, reps)


def verification_profile(target, cache, block) -> list[dict]:
    rows = []
    for w in WIDTHS:
        def run():
            cache.pending = [True] * len(cache.pending)
            target.forward_pass(block[:, :w], cache)
        with module_ranges(target):
            split, counts, how = profile_pass(run)
        count = round(sum(counts.values()))
        graph, _ = captured_pass(target, cache, block[:, :w])
        cache.pending = [True] * len(cache.pending)
        us = median_us(graph, 1, samples=5, replays=10)
        del graph
        total = sum(split.values())
        rows.append(dict(w=w, graph_us=round(us, 1), kernel_us=round(total, 1), kernels=count, attribution=how,
                         **{f"{p}_us": round(split[p], 1) for p in PARTS}))
        log(f"  w={w:2d} graph {us / 1e3:7.3f} ms  kernels {total / 1e3:7.3f} ms ({count})  "
            + "  ".join(f"{p} {split[p] / 1e3:.3f} ({100 * split[p] / total:4.1f}%)" for p in PARTS) + f"  [{how}]")
    return rows


def drafter_profile(session, context: int) -> dict:
    """The drafter's pass: extending its context by one round's features and proposing a block."""
    target, drafter = session.target, session.drafter
    device = target.embed_tokens.weight.device
    drafter.reset(context + 64)
    width = len(drafter.feature_layers) * target.cfg.hidden_size
    gen = torch.Generator(device=device).manual_seed(3)
    drafter.extend(torch.randn(1, context, width, generator=gen, device=device, dtype=target.embed_tokens.weight.dtype))
    features = torch.randn(1, 16, width, generator=gen, device=device, dtype=target.embed_tokens.weight.dtype)
    accepted = torch.full((1,), 8, dtype=torch.long, device=device)
    start = drafter.position.clone()

    def run():
        drafter.position.copy_(start)
        drafter.extend(features, accepted)
        drafter.propose(torch.tensor([5], device=device))

    reps = 5
    times, counts, _ = part_times(profile_calls(ranged(run, "drafter"), reps, device), ("drafter", "other"), reps)
    us = times["drafter"]
    row = dict(kernel_us=round(us, 1), kernels=round(counts["drafter"]), block_size=drafter.cfg.block_size,
               layers=drafter.cfg.num_hidden_layers)
    log(f"  drafter pass (extend 16 + propose {drafter.cfg.block_size}): kernels {us / 1e3:.3f} ms ({row['kernels']})")
    return row


def correlation_calls(target, cache, calls: int) -> tuple[list[dict], dict]:
    """`calls` graph-timed verification calls of random blocks spread over WIDTHS, each with the
    distinct (layer, expert) pairs its routing reaches (from an eager pass of the same block)."""
    W = max(WIDTHS)
    device = target.embed_tokens.weight.device
    gen = torch.Generator().manual_seed(7)
    static = torch.zeros(1, W, dtype=torch.long, device=device)
    graphs = {}
    for w in WIDTHS:
        graphs[w], _ = captured_pass(target, cache, static[:, :w])
    rows = []
    for i in range(calls):
        w = WIDTHS[i % len(WIDTHS)]
        static.copy_(torch.randint(0, target.cfg.vocab_size, (1, W), generator=gen))
        cache.pending = [True] * len(cache.pending)
        routing = target.forward_pass(static[:, :w], cache, record_routing=True).expert_ids
        distinct = distinct_pairs(routing)
        cache.pending = [True] * len(cache.pending)
        rows.append(dict(w=w, distinct=distinct, us=round(median_us(graphs[w], 1, samples=3, replays=5), 1)))
    x = torch.tensor([r["distinct"] for r in rows], dtype=torch.float64)
    y = torch.tensor([r["us"] for r in rows], dtype=torch.float64)
    r = float(torch.corrcoef(torch.stack((x, y)))[0, 1])
    slope, intercept = [float(v) for v in torch.linalg.lstsq(torch.stack((x, torch.ones_like(x)), 1), y[:, None]).solution[:, 0]]
    within = [float(torch.corrcoef(torch.stack((x[m], y[m])))[0, 1]) for w in WIDTHS
              if (m := torch.tensor([q["w"] == w for q in rows])).sum() > 2 and x[m].std() > 0]
    summary = dict(calls=len(rows), pearson_r=round(r, 4), us_per_distinct=round(slope, 3),
                   intercept_us=round(intercept, 1), mean_within_w_r=round(statistics.mean(within), 3) if within else None)
    log(f"  correlation over {len(rows)} calls: r = {r:.4f}; latency ≈ {intercept:.0f} µs + {slope:.2f} µs × distinct "
        f"(mean r within one w: {summary['mean_within_w_r']})")
    return rows, summary


def markdown(result: dict) -> str:
    lines = [f"device: {result['device']}  \ndate: {result['date']}  \nversions: {result['versions']}  \n"
             f"command: `{result['command']}`\n", "## Verification pass by module (kernel time, ms)\n",
             "| w | graph ms | kernels ms | GDN | MoE | attention | other | MoE share |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["profile"]:
        lines.append(f"| {r['w']} | {r['graph_us'] / 1e3:.3f} | {r['kernel_us'] / 1e3:.3f} | {r['gdn_us'] / 1e3:.3f} | "
                     f"{r['moe_us'] / 1e3:.3f} | {r['attention_us'] / 1e3:.3f} | {r['other_us'] / 1e3:.3f} | "
                     f"{100 * r['moe_us'] / r['kernel_us']:.0f} % |")
    d = result["drafter"]
    lines += ["", f"Drafter pass ({d['layers']} layers, block {d['block_size']}): {d['kernel_us'] / 1e3:.3f} ms of kernels "
              f"in {d['kernels']} kernels.", "", "## Latency against distinct (layer, expert) pairs\n"]
    c = result["correlation"]
    lines.append(f"{c['calls']} graph-timed calls over w ∈ {list(WIDTHS)}: Pearson r = {c['pearson_r']}; latency ≈ "
                 f"{c['intercept_us']:.0f} µs + {c['us_per_distinct']:.2f} µs per distinct pair; mean r within one w: "
                 f"{c['mean_within_w_r']}.")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="qwen3.6-35b-a3b")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=90)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("profile_35b.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    session = open_session(args.model, "random", device="cuda", dtype="bfloat16", backend="triton",
                           max_context=args.context + 64)
    target = session.target
    prompt = torch.randint(0, target.cfg.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = prefilled_cache(target, prompt, max(WIDTHS))
    block = torch.randint(0, target.cfg.vocab_size, (1, max(WIDTHS)), generator=torch.Generator().manual_seed(1)).cuda()
    result = dict(device=torch.cuda.get_device_name(), date=dt.date.today().isoformat(),
                  command="python3 bench/profile_35b.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                  versions=dict(python=platform.python_version(), torch=torch.__version__, triton=triton.__version__),
                  model=args.model, context=args.context)
    log(f"{result['device']} {result['versions']} {args.model}, context {args.context}")
    result["profile"] = verification_profile(target, cache, block)
    result["drafter"] = drafter_profile(session, args.context)
    result["calls"], result["correlation"] = correlation_calls(target, cache, args.calls)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_35b.json").write_text(json.dumps(result, indent=1))
    (args.out / "profile_35b.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
