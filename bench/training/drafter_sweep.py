"""Train several drafter recipes at once on one GPU, measure each, and name the best.

    python bench/training/drafter_sweep.py --out DIR --stdlib /tmp/std/python3.11 [--export $OUT]   # one H200, < 9 min
    python bench/training/drafter_sweep.py --out DIR --smoke                                        # CPU, tiny recipe

Each recipe is one `python -m hybridspec.training.embedded` process against the frozen shipped
target, continuing the shipped drafter or training a fresh one; all start together, share the
GPU, and stop by `--train-minutes` (the training loop ends early enough for its evaluation and
save; a process still running a little later is killed). Then every trained drafter, and the
shipped one for reference, is measured by `bench/training/embedded_metrics.py` (`full`, D = 15, greedy,
fp32, the test prompts), one process per drafter and group of categories, all at once, killed at
`--measure-minutes`. The measurement runs on the host's CPU cores by default: batch-1 decoding of
this 7.6 M-parameter pair is launch-bound on the GPU (`gpu_exactness.log` of the device runs: 4 prompts
× 48 tokens of `static:4` in 9.1 s, ≈ 60 ms a round with the prefills; ≈ 21 ms a round on 2 CPU
threads), and ~15 processes sharing one GPU would queue their small kernels behind each other;
`--measure-device cuda` measures on the GPU instead (TF32 off).

DIR gets runs/NAME/ (drafter/, training.json, train.log, metrics-*.json), sweep.json (every
number), sweep.md (the table) and best/drafter: the trained drafter with the highest mean
acceptance length, ready to copy into hybridspec/assets/embedded/drafter. `--export DEST` copies
the few files a device call brings back ($OUT takes at most 8 files, 2 folders deep): sweep.json,
sweep.md, logs.tar.gz (every run's logs, training.json and metrics), drafters.tar (every trained
drafter) and, if there is a best, drafter/ and training.json."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hybridspec.runtime.session import EMBEDDED
from hybridspec.workbench.prompts import load_prompts

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent  # the training processes run from the checkout

ASSET_BUDGET_BYTES = 24 * 2**20
KILL_GRACE_S = 20.0  # a training process still running this long after --train-minutes is killed
SMOKE_KILL_GRACE_S = 120.0  # --smoke on a loaded CPU: start-up and saving take longer than the training


@dataclass(frozen=True)
class SweepRecipe:
    name: str
    about: str
    continued: bool  # from the shipped drafter; else a fresh drafter
    settings: tuple[str, ...]  # --drafter-set KEY=VALUE, after the training command's own stage-2 rule
    shape: tuple[str, ...] = ()  # --drafter-shape KEY=VALUE (fresh drafters only)


# every recipe draws the same 16,384 fresh greedy continuations (seed 2; stages 1-2 used 0 and 1),
# so the continued recipes differ from more-data in one setting each
FRESH_DATA = ("seed=2", "distill_sequences=16384", "distill_batch=2048")
RECIPES = {r.name: r for r in (
    SweepRecipe("more-data", "shipped drafter, 16,384 fresh greedy continuations, lr 1e-3", True, FRESH_DATA),
    SweepRecipe("greedy-only", "as more-data, every batch from greedy continuations", True,
                FRESH_DATA + ("distill_mix=1.0",)),
    SweepRecipe("low-decay", "as more-data, position weights 0.7^(i-1) (not 0.85^(i-1))", True,
                FRESH_DATA + ("position_decay=0.7",)),
    SweepRecipe("greedy-low-decay", "as more-data, greedy continuations only and position weights 0.7^(i-1)",
                True, FRESH_DATA + ("distill_mix=1.0", "position_decay=0.7")),
    SweepRecipe("wide", "fresh drafter, 4 layers, intermediate 1024, lr 2e-3", False, FRESH_DATA,
                ("num_hidden_layers=4", "intermediate_size=1024")),
)}
# the first sweep (bench/results/drafter_sweep.md): the fresh wide drafter trailed every continued
# recipe in held-out top-1 after the same 5.5 min, so the default runs the continued ones
DEFAULT_RECIPES = ("more-data", "greedy-only", "low-decay", "greedy-low-decay")
SMOKE_SETTINGS = ("distill_sequences=6", "distill_batch=6")  # the tiny recipe's data size, after the recipe's


@dataclass
class Job:
    name: str
    command: list[str]
    log: Path
    process: subprocess.Popen | None = None
    status: str = "not started"  # then "running", "done", "failed (rc N)", "killed at the time cap"
    started: float | None = None
    seconds: float | None = None


def run_jobs(jobs: list[Job], *, deadline: float, parallel: int, env: dict) -> None:
    """Runs `jobs`, at most `parallel` at a time; whatever still runs at `deadline` is killed."""
    pending, running = list(jobs), []
    while pending or running:
        while pending and len(running) < parallel and time.time() < deadline:
            job = pending.pop(0)
            job.log.parent.mkdir(parents=True, exist_ok=True)
            with open(job.log, "w") as log:
                job.process = subprocess.Popen(job.command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
            job.status, job.started = "running", time.time()
            running.append(job)
        for job in list(running):
            rc = job.process.poll()
            if rc is None and time.time() > deadline:
                job.process.kill()
                rc, job.status = job.process.wait(), "killed at the time cap"
            elif rc is not None:
                job.status = "done" if rc == 0 else f"failed (rc {rc})"
            if rc is not None:
                job.seconds = round(time.time() - job.started, 1)
                running.remove(job)
        if not running and time.time() > deadline:
            break  # what is still pending is left "not started"
        time.sleep(0.5)


def train_job(recipe: SweepRecipe, run: Path, args) -> Job:
    settings = recipe.settings + (SMOKE_SETTINGS if args.smoke else ())
    command = [sys.executable, "-m", "hybridspec.training.embedded", "--out", str(run), "--device", args.device,
               "--recipe", "tiny" if args.smoke else "full", "--target-dir", str(args.target_dir),
               "--drafter-minutes", str(args.train_minutes), "--wall-minutes", str(args.train_minutes)]
    command += ["--drafter-init", str(args.drafter_init)] if recipe.continued else []
    command += ["--stdlib", str(args.stdlib)] if args.stdlib else []
    command += [x for s in settings for x in ("--drafter-set", s)]
    command += [x for s in recipe.shape for x in ("--drafter-shape", s)]
    return Job(recipe.name, command, run / "train.log")


def measure_jobs(name: str, drafter: Path, run: Path, groups: list[list[str]], args) -> list[Job]:
    jobs = []
    for i, group in enumerate(groups):
        command = [sys.executable, str(HERE / "embedded_metrics.py"), "--device", args.measure_device,
                   "--backend", args.backend, "--model", str(args.target_dir), "--drafter", str(drafter),
                   "--prompts", str(args.prompts), "--policies", "full", "--per-category", str(args.per_category),
                   "--tokens", str(args.tokens), "--categories", ",".join(group), "--threads", "1",
                   "--out", str(run / f"metrics-{i}.json")]
        jobs.append(Job(name, command, run / f"measure-{i}.log"))
    return jobs


def prompt_categories(prompts: Path) -> list[str]:
    """The categories of the prompt set's test split, in file order."""
    return list(dict.fromkeys(p.category for p in load_prompts(prompts, split="test")))


def split_groups(categories: list[str], n: int) -> list[list[str]]:
    return [categories[i::n] for i in range(n) if categories[i::n]]


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


TRAINING_KEYS = ("steps_done", "seconds", "time_limit_s", "distill_sequences_done", "held_out_loss",
                 "held_out_top1_by_position", "held_out_greedy_top1_by_position", "parameters")


def summarize(name: str, about: str, run: Path, training: dict | None, categories: list[str]) -> dict:
    """One row: training record (steps, held-out top-1 by position) and AL per category, merged from
    the run's metrics files; `mean_al` only when every category was measured."""
    al = {}
    for path in sorted(run.glob("metrics-*.json")):
        al.update({c: v["acceptance_length"] for c, v in json.loads(path.read_text())["categories"].items()})
    al = {c: al[c] for c in categories if c in al}
    complete = len(al) == len(categories)
    row = {"recipe": name, "about": about, "acceptance_length": al, "complete": complete,
           "mean_al": sum(al.values()) / len(al) if complete else None,
           "spread": max(al.values()) - min(al.values()) if complete else None}
    if training is not None:
        row.update({k: training.get(k) for k in TRAINING_KEYS})
    drafter = run / "drafter" if name != "shipped" else EMBEDDED / "drafter"
    row["drafter_bytes"] = directory_bytes(drafter) if drafter.is_dir() else None
    return row


def short_table(rows: list[dict]) -> str:
    lines = [f"{'recipe':<12} {'steps':>6} {'greedy top-1 @1,2,3':>20} {'mean AL':>8} {'spread':>7} {'MB':>5}"]
    for r in rows:
        top = r.get("held_out_greedy_top1_by_position") or []
        al = "-" if r["mean_al"] is None else f"{r['mean_al']:.2f}"
        spread = "-" if r["spread"] is None else f"{r['spread']:.2f}"
        mb = "-" if r["drafter_bytes"] is None else f"{r['drafter_bytes'] / 1e6:.1f}"
        lines.append(f"{r['recipe']:<12} {r.get('steps_done') or '-':>6} {' '.join(f'{x:.2f}' for x in top[:3]):>20} "
                     f"{al:>8} {spread:>7} {mb:>5}")
    return "\n".join(lines)


TABLE_NOTE = ("Greedy top-1: the drafter's agreement with the target's greedy continuation of held-out prefixes "
              "at draft positions 1-3, from each run's training.json (shipped: the last stage of the assets' "
              "training.json). AL: `full` (D = 15) acceptance length on the test prompts, per category; "
              "mean over categories.")


def markdown_table(rows: list[dict], categories: list[str]) -> str:
    head = ["recipe", "steps", "greedy top-1 @1,2,3", *categories, "mean AL", "spread", "drafter MB", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        top = r.get("held_out_greedy_top1_by_position") or []
        cells = [r["recipe"], str(r.get("steps_done") or "—"), " ".join(f"{x:.2f}" for x in top[:3]) or "—",
                 *(f"{r['acceptance_length'][c]:.2f}" if c in r["acceptance_length"] else "—" for c in categories),
                 "—" if r["mean_al"] is None else f"**{r['mean_al']:.2f}**",
                 "—" if r["spread"] is None else f"{r['spread']:.2f}",
                 "—" if r["drafter_bytes"] is None else f"{r['drafter_bytes'] / 1e6:.2f}", r["status"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipes", default=",".join(DEFAULT_RECIPES),
                        help=f"comma-separated, of {', '.join(RECIPES)}")
    parser.add_argument("--stdlib", type=Path, help="standard-library folder of the corpus (e.g. /tmp/std/python3.11)")
    parser.add_argument("--target-dir", type=Path, default=EMBEDDED / "target", help="the frozen target")
    parser.add_argument("--drafter-init", type=Path, default=EMBEDDED / "drafter", help="drafter that recipes continue")
    parser.add_argument("--prompts", type=Path, default=EMBEDDED / "prompts.jsonl", help="prompt set (its test split)")
    parser.add_argument("--device", default="cuda", help="training device")
    parser.add_argument("--measure-device", default="cpu", help="measurement device, cpu or cuda (fp32 either way)")
    parser.add_argument("--backend", default="torch", help="runtime backend for the measurement (torch, triton, auto)")
    parser.add_argument("--train-minutes", type=float, default=5.5, help="wall-clock cap of every training process")
    parser.add_argument("--measure-minutes", type=float, default=2.5, help="wall-clock cap of the measurement phase")
    parser.add_argument("--per-category", type=int, default=40, help="test prompts per category")
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    parser.add_argument("--export", type=Path, help="copy the summary, logs and best drafter here (e.g. $OUT)")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU smoke run: the tiny recipe's settings, 1 prompt per category, 8 tokens")
    args = parser.parse_args(argv)
    unknown = set(args.recipes.split(",")) - set(RECIPES)
    if unknown:
        parser.error(f"--recipes: unknown {', '.join(sorted(unknown))} (known: {', '.join(RECIPES)})")
    if args.smoke:
        args.device = args.measure_device = "cpu"
        args.train_minutes, args.measure_minutes = min(args.train_minutes, 0.75), min(args.measure_minutes, 3.0)
        args.per_category, args.tokens = 1, 8
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started, out = time.time(), args.out
    recipes = [RECIPES[name] for name in args.recipes.split(",")]
    categories = prompt_categories(args.prompts)
    cores = os.cpu_count() or 2
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, cores // len(recipes))),
           "RAYON_NUM_THREADS": str(max(1, cores // len(recipes))), "PYTHONUNBUFFERED": "1"}

    train = [train_job(r, out / "runs" / r.name, args) for r in recipes]
    print(f"training {len(train)} recipes at once, {args.train_minutes} min each", flush=True)
    grace = SMOKE_KILL_GRACE_S if args.smoke else KILL_GRACE_S
    run_jobs(train, deadline=time.time() + 60 * args.train_minutes + grace, parallel=len(train), env=env)

    measured = [("shipped", args.drafter_init, out / "runs" / "shipped")]
    measured += [(j.name, out / "runs" / j.name / "drafter", out / "runs" / j.name) for j in train
                 if (out / "runs" / j.name / "drafter" / "config.json").is_file()]
    groups = split_groups(categories, max(1, min(len(categories), cores // len(measured))))
    measure = [job for name, drafter, run in measured for job in measure_jobs(name, drafter, run, groups, args)]
    print(f"measuring {len(measured)} drafters in {len(measure)} processes, {args.measure_minutes} min cap", flush=True)
    env["OMP_NUM_THREADS"] = env["RAYON_NUM_THREADS"] = "1"
    run_jobs(measure, deadline=time.time() + 60 * args.measure_minutes, parallel=max(cores, len(measure)), env=env)

    stages = json.loads((EMBEDDED / "training.json").read_text())
    last = max((k for k in stages if k.startswith("stage")), key=lambda k: int(k[5:]), default=None)
    shipped_record = stages[last].get("drafter") if last else None  # the stage that made the shipped drafter
    rows = [summarize("shipped", f"the shipped drafter ({last} of the assets' training.json)", out / "runs" / "shipped",
                      shipped_record, categories)]
    rows[0]["status"] = ", ".join(sorted({j.status for j in measure if j.name == "shipped"}))
    for recipe, job in zip(recipes, train):
        record_path = out / "runs" / recipe.name / "training.json"
        training = json.loads(record_path.read_text())["drafter"] if record_path.is_file() else None
        row = summarize(recipe.name, recipe.about, out / "runs" / recipe.name, training, categories)
        statuses = sorted({j.status for j in measure if j.name == recipe.name})
        row["status"] = f"train {job.status} ({job.seconds}s)"
        row["status"] += f"; measure {', '.join(statuses)}" if statuses else ""
        row["command"] = job.command
        rows.append(row)
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": None,
              "args": {k: str(v) for k, v in vars(args).items()}, "categories": categories, "recipes": [asdict(r) for r in recipes], "rows": rows,
              "best": pick_best(rows, out)}
    result["seconds"] = round(time.time() - started, 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "sweep.md").write_text(f"# Drafter sweep ({result['date']}, {result['seconds']} s)\n\n"
                                  f"{markdown_table(rows, categories)}\n\n{TABLE_NOTE}\n\n"
                                  f"{best_line(result['best'])}\n")
    if args.export:
        export(out, args.export, result["best"])
    print(short_table(rows))
    print(best_line(result["best"]))
    return result


def export(out: Path, dest: Path, best: dict | None) -> None:
    """sweep.json, sweep.md, logs.tar.gz, drafters.tar (every trained drafter, so that a failed
    measurement loses no training) and the best drafter: at most 7 files, 1 folder deep."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("sweep.json", "sweep.md"):
        shutil.copy(out / name, dest / name)
    with tarfile.open(dest / "logs.tar.gz", "w:gz") as tar:
        for path in sorted((out / "runs").glob("*/*")):
            if path.is_file() and path.suffix in (".log", ".json"):
                tar.add(path, arcname=path.relative_to(out).as_posix())
    with tarfile.open(dest / "drafters.tar", "w") as tar:  # safetensors do not compress
        for path in sorted((out / "runs").glob("*/drafter/*")):
            tar.add(path, arcname=path.relative_to(out).as_posix())
    if best is not None:
        shutil.copytree(out / "best" / "drafter", dest / "drafter", dirs_exist_ok=True)
        shutil.copy(out / "best" / "training.json", dest / "training.json")


def pick_best(rows: list[dict], out: Path) -> dict | None:
    """The trained recipe with the highest mean AL, copied to out/best/drafter, and whether the
    shipped assets stay within the size budget with it in place of the shipped drafter."""
    trained = [r for r in rows[1:] if r["mean_al"] is not None and r["drafter_bytes"]]
    if not trained:
        return None
    best = max(trained, key=lambda r: r["mean_al"])
    target = out / "best" / "drafter"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(out / "runs" / best["recipe"] / "drafter", target)
    shutil.copy(out / "runs" / best["recipe"] / "training.json", out / "best" / "training.json")
    assets = directory_bytes(EMBEDDED) - directory_bytes(EMBEDDED / "drafter") + best["drafter_bytes"]
    shipped = rows[0]["mean_al"]
    return {"recipe": best["recipe"], "mean_al": best["mean_al"], "shipped_mean_al": shipped,
            "beats_shipped": shipped is not None and best["mean_al"] > shipped, "drafter": str(target),
            "assets_bytes_with_it": assets, "fits_asset_budget": assets <= ASSET_BUDGET_BYTES}


def best_line(best: dict | None) -> str:
    if best is None:
        return "best: none (no trained drafter was measured on every category)"
    shipped = "—" if best["shipped_mean_al"] is None else f"{best['shipped_mean_al']:.2f}"
    verdict = "better than" if best["beats_shipped"] else "NOT better than"
    fits = "fits" if best["fits_asset_budget"] else "does NOT fit"
    return (f"best: {best['recipe']} (mean AL {best['mean_al']:.2f}, {verdict} the shipped {shipped}) → "
            f"{best['drafter']}; assets with it {best['assets_bytes_with_it'] / 2**20:.1f} MiB ({fits} 24 MiB)")


if __name__ == "__main__":
    main()
