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
) -> None:
    """Generate from one prompt with a length policy and print the tokens and round statistics."""
    from .runtime.generation import GenerateRequest, run_generate

    request = GenerateRequest(model=model, drafter=drafter, prompt=prompt, prompt_ids=prompt_ids, policy=policy,
                              artifact=artifact, max_new_tokens=max_new_tokens, temperature=temperature,
                              top_p=top_p, top_k=top_k, seed=seed, device=device, dtype=dtype, backend=backend)
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


def main() -> None:  # pragma: no cover
    app()
