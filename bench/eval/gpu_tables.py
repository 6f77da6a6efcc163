"""The paper's tables on one device, through the command line as a user runs it, one stage per call
(each fits one device call of 10 minutes with --quick):

    embedded      capture → fit → eval of the embedded pair: Table 1 layout per category, every
                  policy (ar, full, static:best, ratio, nominal, hybridspec), greedy outputs vs ar
    ablations     Table 3: hybridspec on the PyTorch GDN path (`--backend triton-torch-gdn`: the
                  GDN layers on their PyTorch reference, everything else as shipped, CUDA-graph
                  rounds), beside the embedded stage's nominal (no routing correction),
                  static:best and full
    temperature   Table 6: temperature 1.0 (ar, full, hybridspec): AL, SR
    unseen        Table 2's question: capture and fit on code, comment, docstring; eval on imports,
                  table, test without recalibration
    q35           the qwen3.6-35b-a3b preset (random weights, --drafter random): capture (with the cost
                  profile, the paper's Table 4 and Figure 1b), fit, report
                  (--allow-poor-fit: its acceptance means nothing), then `estimate --costs`: the
                  embedded pair's acceptance with the 35B costs — labelled an estimate

    python3 bench/eval/gpu_tables.py --out DIR --stages embedded [--device cuda]
    .venv/bin/python bench/eval/gpu_tables.py --out /tmp/t --device cpu --model35 random-tiny --tokens 8   # dry run

Each stage writes its stores, artifacts and JSON outputs under DIR; `--collect` assembles every
stage found there into DIR/eval_gpu.json ({"device", "date", "versions", "rows": [{"table",
"category", "policy", "tps", "sr", "al", "mean_w", "exact"}]}) and DIR/eval_gpu.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

SEEN, UNSEEN = "code,comment,docstring", "imports,table,test"
POLICIES = "ar,full,static:best,ratio,nominal,hybridspec"


def hybridspec(*args: str, out: Path | None = None) -> dict | None:
    """Run the CLI; with `out`, its --json stdout is parsed and written there."""
    command = [sys.executable, "-m", "hybridspec", *args]
    print("$ hybridspec " + " ".join(args), flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=out is not None, text=True)
    print(f"  ({time.perf_counter() - t0:.0f} s, exit {done.returncode})", flush=True)
    if out is not None:
        sys.stderr.write(done.stderr[-4000:])
        if done.returncode not in (0, 1):
            raise SystemExit(f"hybridspec {args[0]} failed: {done.stdout[-2000:]}")
        data = json.loads(done.stdout)
        out.write_text(json.dumps(data, indent=1))
        return data
    if done.returncode != 0:
        raise SystemExit(f"hybridspec {args[0]} failed (exit {done.returncode})")
    return None


def run_options(args, tokens: int | None = None, dtype: str = "float32") -> list[str]:
    """The options of every capture and eval: the embedded pair runs in fp32 (its exactness
    reference; `auto` would be bfloat16 on CUDA), the 35B preset in bf16."""
    return ["--device", args.device, "--dtype", dtype, "--max-new-tokens", str(tokens or args.tokens),
            *(["--quick"] if args.quick else [])]


def calibrate(args, db: Path, name: str, artifact: Path, extra: list[str] = (), fit_extra: list[str] = (),
              tokens: int | None = None, dtype: str = "float32") -> None:
    if db.exists():
        db.unlink()
    hybridspec("capture", "--db", str(db), "--name", name, *run_options(args, tokens, dtype), *extra)
    hybridspec("fit", "--db", str(db), "--name", name, "--out", str(artifact), "--allow-poor-fit", "--json", *fit_extra,
               out=artifact.with_suffix(".fit.json"))


def eval_on_copy(args, store: str, out: str, *options: str) -> None:
    """`eval` of the embedded campaign with `options`, into a copy of its store (an eval run per
    campaign and store)."""
    d = args.out
    db = d / store
    shutil.copyfile(d / "emb.duckdb", db)
    hybridspec("eval", "--db", str(db), "--name", "emb", "--artifact", str(d / "emb.safetensors"), "--overwrite",
               *options, *run_options(args), "--json", out=d / out)


def stage_embedded(args) -> None:
    d = args.out
    calibrate(args, d / "emb.duckdb", "emb", d / "emb.safetensors")
    hybridspec("eval", "--db", str(d / "emb.duckdb"), "--name", "emb", "--artifact", str(d / "emb.safetensors"),
               "--policies", POLICIES, *run_options(args), "--json", out=d / "eval_embedded.json")


def stage_ablations(args) -> None:
    eval_on_copy(args, "emb_torch.duckdb", "eval_torch_gdn.json", "--policies", "ar,hybridspec", "--backend",
                 "triton-torch-gdn" if args.device.startswith("cuda") else "torch")


def stage_temperature(args) -> None:
    eval_on_copy(args, "emb_t1.duckdb", "eval_temperature.json", "--policies", "ar,full,hybridspec",
                 "--temperature", "1.0")


def stage_unseen(args) -> None:
    d = args.out
    calibrate(args, d / "seen.duckdb", "seen", d / "seen.safetensors", ["--categories", SEEN])
    hybridspec("eval", "--db", str(d / "seen.duckdb"), "--name", "seen", "--artifact", str(d / "seen.safetensors"),
               "--categories", UNSEEN, "--policies", POLICIES, *run_options(args), "--json",
               out=d / "eval_unseen.json")


def random_prompts(path: Path, model: str, context: int) -> Path:
    """A prompt file of token ids for a preset without a tokenizer: two calibration prompts of
    `context` random ids per category of the embedded set (seeded)."""
    import random

    from hybridspec.runtime.presets import preset_config

    vocab, rng = preset_config(model)["vocab_size"], random.Random(0)
    rows = [{"id": f"{c}-{i}", "category": c, "split": "calib", "prompt_ids": [rng.randrange(vocab) for _ in range(context)]}
            for c in (SEEN + "," + UNSEEN).split(",") for i in range(2)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def stage_q35(args) -> None:
    d = args.out
    prompts = random_prompts(d / "q35_prompts.jsonl", args.model35, args.context)
    calibrate(args, d / "q35.duckdb", "q35", d / "q35.safetensors",
              ["--model", args.model35, "--drafter", "random", "--prompts", str(prompts), "--passes", "all,profile"],
              tokens=args.tokens35, dtype="bfloat16" if args.device.startswith("cuda") else "float32")
    hybridspec("report", "--db", str(d / "q35.duckdb"), "--artifact", str(d / "q35.safetensors"), "--out",
               str(d / "q35_report"))
    hybridspec("estimate", "--db", str(d / "emb.duckdb"), "--name", "emb", "--artifact", str(d / "emb.safetensors"),
               "--costs", str(d / "q35.safetensors"), "--costs-db", str(d / "q35.duckdb"), "--json",
               out=d / "estimate_q35.json")


STAGES = {"embedded": stage_embedded, "ablations": stage_ablations, "temperature": stage_temperature,
          "unseen": stage_unseen, "q35": stage_q35}
TABLES = {"eval_embedded.json": "measured", "eval_torch_gdn.json": "ablation", "eval_temperature.json": "temperature",
          "eval_unseen.json": "unseen"}


def collect(out: Path, device: str) -> dict:
    """Every stage's rows in the results format."""
    rows = []
    for name, table in TABLES.items():
        path = out / name
        if not path.exists():
            continue
        data = json.loads(path.read_text())
        for r in data["measured"]:
            rows.append(dict(table=table, category=r["category"], policy=r["policy"], tps=r["tps"], sr=r["sr"],
                             al=r["al"], mean_w=r["mean_w"], exact=data["exact"] if data["greedy"] else None))
    if (out / "estimate_q35.json").exists():
        for r in json.loads((out / "estimate_q35.json").read_text())["rows"]:
            rows.append(dict(table="estimate_35b", category=r["category"], policy=r["policy"], tps=r["tps"],
                             sr=r["sr"], al=r["al"], mean_w=r["mean_w"], exact=None))
    import torch

    name = torch.cuda.get_device_name() if device.startswith("cuda") and torch.cuda.is_available() else platform.processor()
    return {"device": name, "date": dt.date.today().isoformat(),
            "versions": {"python": platform.python_version(), "torch": torch.__version__}, "rows": rows}


def markdown(result: dict) -> str:
    lines = [f"device: {result['device']}  \ndate: {result['date']}  \nversions: {result['versions']}\n"]
    for table in dict.fromkeys(r["table"] for r in result["rows"]):
        rows = [r for r in result["rows"] if r["table"] == table]
        lines += [f"\n## {table}\n", "| category | policy | TPS | SR | AL | mean w | exact |", "|---|---|---:|---:|---:|---:|---|"]
        lines += [f"| {r['category']} | {r['policy']} | {r['tps']:.1f} | {r['sr']:.2f} | {r['al']:.2f} | "
                  f"{r['mean_w']:.2f} | {r['exact']} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model35", default="qwen3.6-35b-a3b")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens per request")
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens of the preset's random prompts")
    ap.add_argument("--tokens35", type=int, default=16,
                    help="new tokens per request of the preset's capture (fewer than --tokens: its passes run the large model)")
    ap.add_argument("--full", dest="quick", action="store_false", help="every prompt (default: --quick)")
    ap.add_argument("--collect", action="store_true", help="only assemble DIR/eval_gpu.json and .md")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.collect:
        for stage in args.stages.split(","):
            print(f"== {stage}", flush=True)
            STAGES[stage](args)
    result = collect(args.out, args.device)
    (args.out / "eval_gpu.json").write_text(json.dumps(result, indent=1))
    (args.out / "eval_gpu.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
