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
    out: Annotated[Path, typer.Option("--out", help="Folder for the store, the artifact, the server log and the report.")] = Path("demo"),
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, help="Of the one served request.")] = 48,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads of torch in every step and the server (default: OMP_NUM_THREADS, else 1).")] = None,
) -> None:
    """The whole workflow on the embedded default: capture (quick) → fit → eval → serve + one request → report."""
    import os

    import torch

    from .demo import DemoConfig, run_demo_workflow

    # one thread unless told otherwise: on small CPUs a thread team that waits for a descheduled
    # member stalls rounds of the fixed pass, and calibration and eval must share the thread count
    count = threads or int(os.environ.get("OMP_NUM_THREADS") or 1)
    os.environ["OMP_NUM_THREADS"] = str(count)  # the server process inherits it
    torch.set_num_threads(count)
    console.print(f"torch CPU threads: {count} (--threads or OMP_NUM_THREADS to change)")
    try:
        run_demo_workflow(DemoConfig(out=out, max_new_tokens=max_new_tokens), console)
    except (ValueError, RuntimeError) as exc:  # config, store, fit, artifact and server errors name what failed
        _fail(str(exc))


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
    from .serve.app import serve as run_server
    from .serve.service import open_service

    try:
        service = open_service(artifact=artifact, model=model, drafter=drafter, policy=policy, device=device,
                               dtype=dtype, backend=backend, max_context=max_context, force=force,
                               model_name=served_model_name)
    except ValueError as exc:  # ConfigError, PolicyError, ArtifactError
        _fail(str(exc))
    console.print(f"serving [bold]{service.model_name}[/] (policy {policy}) on http://{host}:{port}/v1")
    run_server(service, host=host, port=port, api_key=api_key)


@app.command("train-embedded")
def train_embedded(
    out: Annotated[Path, typer.Option("--out", help="Output directory (target/, drafter/, prompts.jsonl).")],
    recipe: Annotated[str, typer.Option("--recipe", help="full (GPU) or tiny (CPU smoke).")] = "full",
    device: Annotated[Optional[str], typer.Option("--device")] = None,
    target_dir: Annotated[Optional[Path], typer.Option("--target-dir", help="Reuse a trained target.")] = None,
    drafter_init: Annotated[Optional[Path], typer.Option("--drafter-init", help="With --target-dir: continue training this drafter.")] = None,
    stdlib: Annotated[Optional[Path], typer.Option("--stdlib", help="Standard-library folder to read (default: this interpreter's).")] = None,
    target_minutes: Annotated[Optional[float], typer.Option("--target-minutes", help="Cap on target training time.")] = None,
    drafter_minutes: Annotated[Optional[float], typer.Option("--drafter-minutes", help="Cap on drafter training time.")] = None,
) -> None:
    """Train the embedded default pair from a Python standard library (this interpreter's by default)."""
    from .training.embedded import main as train_main

    options = {"--device": device, "--target-dir": target_dir, "--drafter-init": drafter_init, "--stdlib": stdlib,
               "--target-minutes": target_minutes, "--drafter-minutes": drafter_minutes}
    train_main(["--out", str(out), "--recipe", recipe]
               + [str(x) for flag, value in options.items() if value is not None for x in (flag, value)])


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
    from .fitters.campaign import FitError
    from .workbench.store import StoreError
    from .fitters.export import fit_artifact
    from .fitters.fit_output import print_fit

    if not db.is_file():
        _fail(f"--db {db}: no such store")
    try:
        result, meta = fit_artifact(db, run, out)
    except (FitError, StoreError) as exc:
        _fail(str(exc))
    print_fit(console, result, out, meta)


@app.command("eval")
def eval_(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    artifact: ArtifactOpt = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt set (JSONL); default: the embedded set.")] = None,
    split: Annotated[str, typer.Option("--split", help="calib or test.")] = "test",
    policies: Annotated[Optional[str], typer.Option("--policies", help="Comma-separated (default ar,full,static:7 and, with --artifact, ratio,ratio4,nominal,hybridspec); ar always runs.")] = None,
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file (created or extended).")] = Path("capture.duckdb"),
    name: Annotated[str, typer.Option("--name", help="Campaign name (capture's --name: its capture run gives the offline estimates).")] = "default",
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Per prompt (default 128; 32 with --quick).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0: greedy, outputs compared with ar.")] = 0.0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    quick: Annotated[bool, typer.Option("--quick", help="2 prompts per category, 32 new tokens.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an eval run of this name, skipping finished units.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an eval run of this name.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
) -> None:
    """Decode a prompt split with each policy, record every request and round, print Table 1 (TPS, SR, AL, w)."""
    from .collectors.eval_output import print_eval
    from .collectors.evaluate import EvalConfig, parse_policies, run_eval
    from .collectors.progress import RichReporter

    try:
        config = EvalConfig(model=model, drafter=drafter, artifact=artifact, prompts=prompts, split=split,
                            policies=parse_policies(policies), db=db, name=name, max_new_tokens=max_new_tokens,
                            temperature=temperature, device=device, dtype=dtype, backend=backend, quick=quick,
                            resume=resume, overwrite=overwrite, force=force)
        with RichReporter(console) as reporter:
            result = run_eval(config, reporter)
    except ValueError as exc:  # EvalConfigError, PolicyError, ArtifactError, StoreError, PromptFileError, ConfigError
        _fail(str(exc))
    print_eval(console, result)


@app.command()
def report(
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file.")] = Path("capture.duckdb"),
    out: Annotated[Path, typer.Option("--out", help="Folder for index.html (self-contained).")] = Path("report"),
    artifact: ArtifactOpt = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Campaign (capture's --name); default: the newest.")] = None,
) -> None:
    """Diagnostics of a calibration (and its evals) as one HTML page with plots, plus a terminal summary."""
    from .report import build_report, summary

    try:
        result = build_report(db, out, artifact=artifact, campaign=name)
    except ValueError as exc:  # ReportError, ArtifactError
        _fail(str(exc))
    console.print(summary(result))
    console.print(f"[bold green]report:[/] {result.path.resolve()}")


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
