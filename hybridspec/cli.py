"""`hybridspec` command line: thin adapters over library functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console()

ModelOpt = Annotated[Optional[str], typer.Option("--model", help="Model directory or preset name (default: the embedded model).")]
DrafterOpt = Annotated[Optional[str], typer.Option("--drafter", help="DFlash drafter directory, or `random`.")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="ar, full, static:N, ratio, ratio4, nominal, hybridspec.")]
ArtifactOpt = Annotated[Optional[Path], typer.Option("--artifact", help="Policy parameters from `hybridspec fit`.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="auto (triton on CUDA), torch or triton (GDN kernels).")]


def _fail(message: str) -> None:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(2)


@app.command()
def generate(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    prompt: Annotated[Optional[str], typer.Option("--prompt", help="Prompt text.")] = None,
    prompt_ids: Annotated[Optional[str], typer.Option("--prompt-ids", help="Prompt token ids, comma-separated.")] = None,
    policy: PolicyOpt = "hybridspec",
    artifact: ArtifactOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 64,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.0,
    top_p: Annotated[float, typer.Option("--top-p")] = 1.0,
    top_k: Annotated[int, typer.Option("--top-k", min=0)] = 0,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
) -> None:
    """Generate from one prompt with a length policy and print the tokens and round statistics."""
    from .runtime.generation import GenerateRequest, run_generate

    request = GenerateRequest(model=model, drafter=drafter, prompt=prompt, prompt_ids=prompt_ids, policy=policy,
                              artifact=artifact, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed, device=device, dtype=dtype, backend=backend,
                              force=force)
    try:
        summary = run_generate(request)
    except ValueError as exc:  # ConfigError, PolicyError, ArtifactError, bad sampling values
        _fail(str(exc))
    if as_json:
        print(json.dumps(summary))
        return
    _print_summary(summary)


def _print_summary(summary: dict) -> None:
    if summary["random_weights"]:
        console.print(f"[yellow]model {summary['model']!r} has random weights: tokens are meaningless, "
                      "acceptance is near zero[/]")
    console.print(f"[bold]tokens[/] {summary['token_ids']}")
    if summary["text"]:
        console.print(f"[bold]text[/] {summary['text']}")
    table = Table("policy", "tokens", "rounds", "AL", "mean w", "decode s", "tok/s", title="generation")
    table.add_row(summary["policy"], str(len(summary["token_ids"])), str(summary["rounds"]),
                  f"{summary['acceptance_length']:.2f}", f"{summary['mean_verification_length']:.2f}",
                  f"{summary['decode_seconds']:.3f}", f"{summary['decode_tokens_per_second']:.1f}")
    console.print(table)


@app.command()
def demo(
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1)] = 48,
) -> None:
    """Decode one prompt of the embedded default with the policies that need no calibration."""
    from .runtime.generation import GenerateRequest, demo_prompt, run_generate

    prompt, prompt_ids = demo_prompt()
    table = Table("policy", "tokens", "rounds", "AL", "mean w", "decode s", "tok/s", "equals ar", title="demo")
    reference = None
    for policy in ("ar", "full", "static:4", "static:8"):
        summary = run_generate(GenerateRequest(prompt=prompt, prompt_ids=prompt_ids, policy=policy,
                                               max_new_tokens=max_new_tokens))
        reference = reference or summary["token_ids"]
        table.add_row(policy, str(len(summary["token_ids"])), str(summary["rounds"]),
                      f"{summary['acceptance_length']:.2f}", f"{summary['mean_verification_length']:.2f}",
                      f"{summary['decode_seconds']:.3f}", f"{summary['decode_tokens_per_second']:.0f}",
                      "yes" if summary["token_ids"] == reference else "NO")
    console.print(f"[bold]model[/] {summary['model']}")
    if summary["random_weights"]:
        console.print("[yellow]random weights (the embedded pair is not installed): tokens are meaningless[/]")
    if prompt:
        console.print(f"[bold]prompt[/] (last lines)\n{prompt[-300:]}")
        console.print(f"[bold]continuation[/]\n{summary['text']}")
    console.print(table)


@app.command("train-embedded")
def train_embedded(
    out: Annotated[Path, typer.Option("--out", help="Output directory (target/, drafter/, prompts.jsonl).")],
    recipe: Annotated[str, typer.Option("--recipe", help="full (GPU) or tiny (CPU smoke).")] = "full",
    device: Annotated[Optional[str], typer.Option("--device")] = None,
    target_dir: Annotated[Optional[Path], typer.Option("--target-dir", help="Reuse a trained target.")] = None,
) -> None:
    """Train the embedded default pair from this interpreter's standard library."""
    from .training.embedded import main as train_main

    args = ["--out", str(out), "--recipe", recipe] + (["--device", device] if device else [])
    train_main(args + (["--target-dir", str(target_dir)] if target_dir else []))


@app.command()
def capture(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt set (JSONL); default: the embedded set.")] = None,
    split: Annotated[str, typer.Option("--split", help="calib or test.")] = "calib",
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file (created or extended).")] = Path("capture.duckdb"),
    name: Annotated[str, typer.Option("--name", help="Campaign name; with the pass it identifies a run.")] = "default",
    passes: Annotated[str, typer.Option("--passes", help="capture,fixed,stage0,moe,routing or all.")] = "all",
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Per prompt (default 128; 64 with --quick).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    quick: Annotated[bool, typer.Option("--quick", help="2 prompts per category, fewer lengths and samples.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a run of this name, skipping finished units.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run of this name.")] = False,
    shard: Annotated[str, typer.Option("--shard", help="i/n: this process takes every n-th unit from i (0-based).")] = "0/1",
) -> None:
    """Run calibration passes through the real runtime and record every round and timing in DuckDB."""
    from .collectors.campaign import run_campaign
    from .collectors.common import CaptureConfig, parse_passes, parse_shard
    from .collectors.progress import RichReporter, summary_table

    try:
        config = CaptureConfig(model=model, drafter=drafter, prompts=prompts, split=split, db=db, name=name,
                               passes=parse_passes(passes), max_new_tokens=max_new_tokens, device=device,
                               dtype=dtype, backend=backend, quick=quick, resume=resume, overwrite=overwrite,
                               shard=parse_shard(shard))
        with RichReporter(console) as reporter:
            summaries = run_campaign(config, reporter)
    except ValueError as exc:  # CaptureConfigError, StoreError, PromptFileError, ConfigError
        _fail(str(exc))
    console.print(summary_table(summaries, db))


@app.command()
def merge(
    out: Annotated[Path, typer.Argument(help="The merged store (created or extended).")],
    inputs: Annotated[list[Path], typer.Argument(help="Shard stores to combine.")],
) -> None:
    """Combine stores written by several processes or hosts (`capture --shard i/n`) into one."""
    from .workbench.store import merge_stores

    try:
        counts = merge_stores(out, inputs)
    except ValueError as exc:
        _fail(str(exc))
    table = Table("table", "rows", title=f"merged {len(inputs)} stores into {out}")
    for name, rows in counts.items():
        table.add_row(name, str(rows))
    console.print(table)


def main() -> None:  # pragma: no cover
    app()
