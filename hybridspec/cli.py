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
    from .runtime.generation import run_demo

    prompt, summaries = run_demo(("ar", "full", "static:4", "static:8"), max_new_tokens)
    table = Table("policy", "tokens", "rounds", "AL", "mean w", "decode s", "tok/s", "equals ar", title="demo")
    for summary in summaries:
        table.add_row(summary["policy"], str(len(summary["token_ids"])), str(summary["rounds"]),
                      f"{summary['acceptance_length']:.2f}", f"{summary['mean_verification_length']:.2f}",
                      f"{summary['decode_seconds']:.3f}", f"{summary['decode_tokens_per_second']:.0f}",
                      "yes" if summary["token_ids"] == summaries[0]["token_ids"] else "NO")
    console.print(f"[bold]model[/] {summaries[0]['model']}")
    if summaries[0]["random_weights"]:
        console.print("[yellow]random weights (the embedded pair is not installed): tokens are meaningless[/]")
    if prompt:
        console.print(f"[bold]prompt[/] (last lines)\n{prompt[-300:]}")
        console.print(f"[bold]continuation[/]\n{summaries[0]['text']}")
    console.print(table)


@app.command()
def serve(
    artifact: ArtifactOpt = None,
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    host: Annotated[str, typer.Option("--host", help="Interface to bind (0.0.0.0 exposes the server).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 30000,
    policy: Annotated[str, typer.Option("--policy", help="Default policy; ar, full and static:N need no --artifact.")] = "hybridspec",
    api_key: Annotated[Optional[str], typer.Option("--api-key", help="Require `Authorization: Bearer KEY` on /v1/*.")] = None,
    served_model_name: Annotated[Optional[str], typer.Option("--served-model-name", help="The `model` clients send (default: --model, or hybridspec-embedded).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    max_context: Annotated[int, typer.Option("--max-context", min=2, help="Prompt + generated tokens per request.")] = 4096,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (completions, chat, models, health, metrics)."""
    import uvicorn

    from .runtime.server import create_app, open_service

    try:
        service = open_service(artifact=artifact, model=model, drafter=drafter, policy=policy, device=device,
                               dtype=dtype, backend=backend, max_context=max_context, force=force,
                               model_name=served_model_name)
    except ValueError as exc:  # ConfigError, PolicyError, ArtifactError
        _fail(str(exc))
    console.print(f"serving [bold]{service.model_name}[/] (policy {policy}) on http://{host}:{port}/v1")
    uvicorn.run(create_app(service, api_key=api_key), host=host, port=port, log_level="warning")


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


@app.command()
def fit(
    db: Annotated[Path, typer.Option("--db", help="Calibration store written by `hybridspec capture`.")],
    out: Annotated[Path, typer.Option("--out", help="Artifact file to write.")],
    run: Annotated[str, typer.Option("--run", help="Campaign name (capture's --name).")] = "default",
) -> None:
    """Fit the acceptance model, C_tgt, s, η, the routing tables and ρ; write the frozen artifact."""
    from .artifacts.artifact import save_artifact
    from .fitters.campaign import FitError, fit_campaign
    from .workbench.store import StoreError

    if not db.is_file():
        _fail(f"--db {db}: no such store")
    try:
        result = fit_campaign(db, run)
    except (FitError, StoreError) as exc:
        _fail(str(exc))
    meta = save_artifact(out, _parameters(result), model_id=result.model_id, drafter_id=result.drafter_id or "",
                         device=result.device, store_digest=result.store_digest, diagnostics=result.diagnostics())
    _print_fit(result, out, meta)


def _parameters(result):
    """A campaign fit as the runtime's policy parameters."""
    from .artifacts.params import AcceptanceModel, PolicyParameters

    acc = result.acceptance
    model = AcceptanceModel(iso_x=tuple(tuple(map(float, x)) for x in acc.iso_x_),
                            iso_y=tuple(tuple(map(float, y)) for y in acc.iso_y_), coef=tuple(map(float, acc.coef_)))
    return PolicyParameters(
        draft_len=result.draft_len, lengths=result.lengths, cost=tuple(map(float, result.cost.table(result.draft_len + 1))),
        fixed_cost=result.cost.fixed_cost_, rho=result.rho, s=result.stage0.slope_, eta=result.moe.slope_,
        nbar_all=tuple(map(float, result.routing.nbar_all_)),
        nbar_cond=tuple(tuple(map(float, row)) for row in result.routing.nbar_cond_), acceptance=model)


def _print_fit(result, out: Path, meta: dict) -> None:
    console.print(f"[bold]artifact[/] {out}  ({meta['content_sha256'][:19]}…)")
    console.print(f"ρ = {result.rho:.2f} tokens/s   s = {result.stage0.slope_ * 1e6:.2f} µs/token   "
                  f"η = {result.moe.slope_ * 1e6:.2f} µs/expert (r = {result.moe.correlation_:.3f})   "
                  f"fixed = {result.cost.fixed_cost_ * 1e3:.2f} ms   Dinkelbach iterations {len(result.iterations)}")
    table = result.cost.table(result.draft_len + 1)
    console.print("C_tgt(w) ms: " + "  ".join(f"{w}:{table[w] * 1e3:.2f}" for w in result.lengths))
    metrics = Table("estimate", "log-loss", "Brier", "ECE", "rows", title="acceptance, held-out rounds")
    for name, m in result.metrics.items():
        metrics.add_row(name, f"{m['log_loss']:.4f}", f"{m['brier']:.4f}", f"{m['ece']:.4f}", str(m["rows"]))
    console.print(metrics)
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {warning}")


@app.command()
def inspect(path: Annotated[Path, typer.Argument(help="Artifact file.")]) -> None:
    """Print an artifact's contents; exit non-zero when it is invalid."""
    import json as _json

    from .artifacts.artifact import ArtifactError, load_artifact

    try:
        params, meta = load_artifact(path)
    except ArtifactError as exc:
        _fail(str(exc))
    shown = {k: v for k, v in meta.items() if k != "diagnostics"}
    console.print_json(_json.dumps(shown))
    table = Table("w", "C_tgt ms", "n̄_all", title=f"{path.name}: per length")
    for w in params.lengths:
        table.add_row(str(w), f"{params.cost[w] * 1e3:.3f}", f"{params.nbar_all[w]:.2f}")
    console.print(table)
    console.print(f"acceptance coefficients {[round(c, 4) for c in params.acceptance.coef]}; "
                  f"warnings: {meta['diagnostics'].get('warnings', [])}")


def main() -> None:  # pragma: no cover
    app()
