"""Commands that calibrate and analyse: capture, merge, fit, eval, estimate, report, inspect, export."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from .common import (ArtifactOpt, BackendOpt, DeviceOpt, DrafterOpt, DtypeOpt, ExpertParallelOpt, GraphsOpt, ModelOpt,
                     TensorParallelOpt, _fail, app, console, err_console)

def _print_json(obj) -> None:
    """One JSON object on stdout (numpy scalars as numbers)."""
    print(json.dumps(obj, default=lambda o: o.item() if hasattr(o, "item") else str(o)))


CategoriesOpt = Annotated[Optional[str], typer.Option("--categories", help="Comma-separated prompt categories to use (default: all of the split); e.g. calibrate on some, evaluate on the others.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="torch CPU threads of this process (default: 1 on a CPU device, torch's default on CUDA); recorded with every run.")]


@app.command()
def capture(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt set (JSONL); default: the embedded set.")] = None,
    split: Annotated[str, typer.Option("--split", help="calib or test.")] = "calib",
    categories: CategoriesOpt = None,
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file (created or extended).")] = Path("capture.duckdb"),
    name: Annotated[str, typer.Option("--name", help="Campaign name; with the pass it identifies a run.")] = "default",
    passes: Annotated[str, typer.Option("--passes", help="capture,fixed,stage0,moe,routing or all (the passes fit needs); "
                                                            "profile (the cost profile by module) only when named, "
                                                            "e.g. all,profile.")] = "all",
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Per prompt (default 128; 64 with --quick).")] = None,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    graphs: GraphsOpt = True,
    quick: Annotated[bool, typer.Option("--quick", help="2 prompts per category, fewer lengths and samples.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue a run of this name, skipping finished units.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run of this name.")] = False,
    shard: Annotated[str, typer.Option("--shard", help="i/n: this process takes every n-th unit from i (0-based).")] = "0/1",
    threads: ThreadsOpt = None,
    tp: TensorParallelOpt = 1,
    expert_parallel: ExpertParallelOpt = False,
    nproc: Annotated[int, typer.Option("--nproc", min=1, help="Data-parallel processes (one GPU each on CUDA): process i runs --shard i/N into a store beside --db, and the shards are merged into --db.")] = 1,
) -> None:
    """Run calibration passes through the real runtime and record every round and timing in DuckDB."""
    from ..collectors.campaign import CaptureInterrupted, run_campaign
    from ..collectors.common import CaptureConfig, parse_passes, parse_shard
    from ..workbench.prompts import parse_categories
    from ..collectors.progress import RichReporter, summary_table

    try:
        config = CaptureConfig(model=model, drafter=drafter, prompts=prompts, split=split, db=db, name=name,
                               passes=parse_passes(passes), max_new_tokens=max_new_tokens, device=device,
                               dtype=dtype, backend=backend, graphs=graphs, quick=quick, resume=resume,
                               overwrite=overwrite, shard=parse_shard(shard), threads=threads,
                               categories=parse_categories(categories), tp=tp, expert_parallel=expert_parallel,
                               nproc=nproc)
        if tp > 1 or nproc > 1:  # the processes that run the passes report their progress
            summaries = run_campaign(config)
        else:
            with RichReporter(console) as reporter:
                summaries = run_campaign(config, reporter)
    except CaptureInterrupted as exc:  # Ctrl-C: the committed units stay; say how to continue
        err_console.print(escape(exc.message(sys.argv[1:])), soft_wrap=True, highlight=False)
        raise typer.Exit(130)
    except ValueError as exc:  # CaptureConfigError, StoreError, PromptFileError, ConfigError
        _fail(str(exc))
    if summaries is not None:  # None: a rank other than 0 under torchrun
        console.print(summary_table(summaries, db))


@app.command()
def merge(
    out: Annotated[Path, typer.Argument(help="The merged store (created or extended).")],
    inputs: Annotated[list[Path], typer.Argument(help="Shard stores to combine.")],
) -> None:
    """Combine stores written by several processes or hosts (`capture --shard i/n`) into one."""
    from ..workbench.store import merge_stores

    try:
        counts = merge_stores(out, inputs)
    except ValueError as exc:
        _fail(str(exc))
    table = Table("table", "rows", title=f"merged {len(inputs)} stores into {out}")
    for name, rows in counts.items():
        table.add_row(name, str(rows))
    console.print(table)


def _threshold_help() -> str:
    from ..fitters.checks import Thresholds

    defaults = ", ".join(f"{k}={v:g}" for k, v in Thresholds().as_dict().items())
    return f"NAME=VALUE, repeatable: a fit-quality limit (defaults {defaults}; see fitters/checks.py)."


@app.command()
def fit(
    db: Annotated[Path, typer.Option("--db", help="Calibration store written by `hybridspec capture`.")],
    out: Annotated[Path, typer.Option("--out", help="Artifact file to write.")],
    name: Annotated[Optional[str], typer.Option("--name", help="Campaign (capture's --name); default: the store's only campaign.")] = None,
    allow_poor_fit: Annotated[bool, typer.Option("--allow-poor-fit", help="Write the artifact even when fit-quality checks fail (recorded in it).")] = False,
    threshold: Annotated[Optional[list[str]], typer.Option("--threshold", help=_threshold_help())] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the summary) instead of tables.")] = False,
) -> None:
    """Fit the acceptance model, C_tgt, s, η, the routing tables and ρ; check the fit; write the frozen artifact.

    Exit 1 with one line per failed fit-quality check (nothing written) unless --allow-poor-fit;
    exit 2 for unusable input."""
    from ..fitters.checks import Thresholds
    from ..fitters.export import PoorFitError, fit_artifact
    from ..fitters.fit_output import fit_json, print_fit
    from ..workbench.store import require_store, resolve_campaign

    try:
        require_store(db)
        thresholds = Thresholds.parse(threshold or ())
        campaign = resolve_campaign(db, name)
        result, meta = fit_artifact(db, campaign, out, thresholds=thresholds, allow_poor_fit=allow_poor_fit)
    except PoorFitError as exc:  # the fit without its artifact, then one line per failed check
        if as_json:
            _print_json(fit_json(exc.result, None, None, exc.checks))
            raise typer.Exit(1)
        exc.result.checks = []
        print_fit(console, exc.result, None, None)
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", soft_wrap=True, highlight=False)
        raise typer.Exit(1)
    except ValueError as exc:  # FitError, StoreError (damaged store), OutputPathError, a bad --threshold
        _fail(str(exc))
    if as_json:
        _print_json(fit_json(result, out, meta, result.checks))
        return
    print_fit(console, result, out, meta)
    if meta["diagnostics"].get("allow_poor_fit"):
        console.print("[bold yellow]written with failed checks (--allow-poor-fit); `inspect` will exit non-zero[/]")


@app.command("eval")
def eval_(
    model: ModelOpt = None,
    drafter: DrafterOpt = None,
    artifact: ArtifactOpt = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt set (JSONL); default: the embedded set.")] = None,
    split: Annotated[str, typer.Option("--split", help="calib or test.")] = "test",
    categories: CategoriesOpt = None,
    policies: Annotated[Optional[str], typer.Option("--policies", help="Comma-separated (default ar,full,static:7 and, with --artifact, ratio,ratio4,nominal,hybridspec); ar always runs.")] = None,
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file (created or extended).")] = Path("capture.duckdb"),
    name: Annotated[Optional[str], typer.Option("--name", help="Campaign name (capture's --name: its capture run gives the offline estimates); default: the store's only campaign, else `default`.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option("--max-new-tokens", help="Per prompt (default 128; 32 with --quick).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="0: greedy, outputs compared with ar.")] = 0.0,
    device: DeviceOpt = "cpu",
    dtype: DtypeOpt = "float32",
    backend: BackendOpt = "auto",
    graphs: GraphsOpt = True,
    quick: Annotated[bool, typer.Option("--quick", help="2 prompts per category, 32 new tokens.")] = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue an eval run of this name, skipping finished units.")] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an eval run of this name.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
    threads: ThreadsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the summary) instead of tables.")] = False,
) -> None:
    """Decode a prompt split with each policy, record every request and round, print Table 1 (TPS, SR, AL, w)."""
    from ..collectors.eval_output import eval_json, print_eval
    from ..collectors.evaluate import EvalConfig, parse_policies, run_eval
    from ..workbench.prompts import parse_categories
    from ..collectors.progress import RichReporter
    from ..workbench.store import resolve_campaign

    try:
        config = EvalConfig(model=model, drafter=drafter, artifact=artifact, prompts=prompts, split=split,
                            policies=parse_policies(policies), db=db,
                            name=resolve_campaign(db, name, fallback="default"), max_new_tokens=max_new_tokens,
                            temperature=temperature, device=device, dtype=dtype, backend=backend, graphs=graphs, quick=quick,
                            resume=resume, overwrite=overwrite, force=force, threads=threads,
                            categories=parse_categories(categories))
        with RichReporter(err_console if as_json else console) as reporter:  # stdout keeps only the JSON
            result = run_eval(config, reporter)
    except ValueError as exc:  # EvalConfigError, PolicyError, ArtifactError, StoreError, PromptFileError, ConfigError
        _fail(str(exc))
    if as_json:
        _print_json(eval_json(result))
        return
    print_eval(console, result)


@app.command()
def estimate(
    db: Annotated[Path, typer.Option("--db", help="Store holding the capture run whose rounds are replayed.")],
    artifact: Annotated[Path, typer.Option("--artifact", help="Artifact fitted on that campaign (its acceptance model; its costs unless --costs).")],
    name: Annotated[Optional[str], typer.Option("--name", help="Campaign of --db (default: the store's only one).")] = None,
    costs: Annotated[Optional[Path], typer.Option("--costs", help="Another target's artifact: its C_tgt, fixed cost, s, η and n̄ replace --artifact's; ρ is solved again.")] = None,
    costs_db: Annotated[Optional[Path], typer.Option("--costs-db", help="The --costs target's store: its routing pass (new Layer-0 experts per position) and measured ar step.")] = None,
    costs_name: Annotated[Optional[str], typer.Option("--costs-name", help="Campaign of --costs-db (default: its only one).")] = None,
    policies: Annotated[Optional[str], typer.Option("--policies", help="Comma-separated (default: ar, full, every static length, ratio, ratio4, nominal, hybridspec).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Use an artifact fitted for another model/drafter.")] = False,
) -> None:
    """Offline estimate of each policy over a capture run's rounds (no model loaded). With --costs:
    the acceptance of --artifact's pair with another target's costs — an estimate for a target whose
    acceptance cannot be measured (random weights), labelled as such."""
    from ..collectors.eval_output import table1
    from ..collectors.evaluate import parse_policies
    from ..evaluation.estimate import OtherCosts, estimate_offline
    from ..evaluation.offline import AVERAGE

    if (costs is None) != (costs_db is None):
        _fail("--costs and --costs-db go together (the costs' artifact and the store it was fitted on)")
    other = OtherCosts(costs, costs_db, costs_name) if costs is not None else None
    try:
        result = estimate_offline(db, artifact, campaign=name, policies=parse_policies(policies), costs=other,
                                  force=force)
    except ValueError as exc:  # ArtifactError, StoreError, OfflineError, FitError, PolicyError
        _fail(str(exc))
    if as_json:
        _print_json({"kind": result.kind, "rho": result.rho, "sources": result.sources,
                     "rows": result.table.to_dicts()})
        return
    title = f"{result.kind} (pooled per category; {AVERAGE}: mean over categories)"
    for part in table1(result.table, result.policies, title, console.width):
        console.print(part)
    for what, where in result.sources.items():
        console.print(f"[dim]{what}: {escape(where)}[/]")
    console.print(f"[dim]ρ = {result.rho:.4g} tokens/s[/]")


@app.command()
def report(
    db: Annotated[Path, typer.Option("--db", help="The campaign's DuckDB file.")] = Path("capture.duckdb"),
    out: Annotated[Path, typer.Option("--out", help="Folder for index.html (self-contained).")] = Path("report"),
    artifact: ArtifactOpt = None,
    name: Annotated[Optional[str], typer.Option("--name", help="Campaign (capture's --name); default: the newest campaign with a capture run, else the newest campaign.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (the summary) instead of tables.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Show the fit, checks and estimates of an artifact fitted for another model/drafter (each section says so).")] = False,
) -> None:
    """Diagnostics of a calibration (and its evals) as one HTML page with plots, plus a terminal summary."""
    from ..report import build_report, summary
    from ..report.terminal import report_json
    from ..workbench.paths import check_output_dir

    try:
        check_output_dir(out)
        result = build_report(db, out, artifact=artifact, campaign=name, force=force)
    except ValueError as exc:  # ReportError, ArtifactError, StoreError (damaged store), OutputPathError
        _fail(str(exc))
    if as_json:
        _print_json(report_json(result))
        return
    console.print(summary(result))
    console.print(f"[bold green]report:[/] {result.path.resolve()}")


@app.command()
def inspect(
    path: Annotated[Path, typer.Argument(help="Artifact file.")],
    threshold: Annotated[Optional[list[str]], typer.Option("--threshold", help="NAME=VALUE: a limit other than the one the artifact was fitted with.")] = None,
) -> None:
    """Print an artifact's contents and fit-quality checks; exit 2 when it is invalid, 1 when a check fails."""
    import json as _json

    from ..artifacts.artifact import ArtifactError, load_artifact
    from ..fitters.checks import Thresholds, checks_from_artifact, failed
    from ..fitters.fit_output import checks_table

    try:
        params, meta = load_artifact(path)
        diagnostics = meta["diagnostics"] if isinstance(meta.get("diagnostics"), dict) else {}
    except (ArtifactError, ValueError) as exc:
        _fail(str(exc))
    try:
        recorded = Thresholds.parse(base=diagnostics.get("thresholds"))
    except ValueError as exc:  # a limit the artifact records, outside its range
        _fail(f"{path}: {exc}")
    try:
        thresholds = Thresholds.parse(threshold or (), base=recorded.as_dict())
    except ValueError as exc:
        _fail(str(exc))
    shown = {k: v for k, v in meta.items() if k != "diagnostics"}
    console.print_json(_json.dumps(shown))
    table = Table("w", "C_tgt ms", "n̄_all", title=f"{path.name}: per length")
    for w in params.lengths:
        table.add_row(str(w), f"{params.cost[w] * 1e3:.3f}", f"{params.nbar_all[w]:.2f}")
    console.print(table)
    console.print(f"acceptance coefficients {[round(c, 4) for c in params.acceptance.coef]}; "
                  f"warnings: {escape(str(diagnostics.get('warnings', [])))}")
    checks = checks_from_artifact(params, meta, thresholds)
    console.print(checks_table(checks))
    bad = failed(checks)
    if bad:
        override = " (written with --allow-poor-fit)" if diagnostics.get("allow_poor_fit") else ""
        for check in bad:
            console.print(f"[bold red]failed:[/] {escape(check.line())}")
        console.print(f"[bold red]{len(bad)} fit-quality check(s) failed{override}[/]")
        raise typer.Exit(1)


@app.command()
def export(
    db: Annotated[Path, typer.Option("--db", help="The store to export.")],
    out: Annotated[Path, typer.Option("--out", help="Directory for one file per table.")],
    fmt: Annotated[str, typer.Option("--format", help="parquet or csv.")] = "parquet",
    name: Annotated[Optional[str], typer.Option("--name", help="Only the runs of this campaign (every pass).")] = None,
) -> None:
    """Write every table of a store (columns as in docs/store.md) as Parquet or CSV, through DuckDB's COPY."""
    from ..workbench.export import export_store
    from ..workbench.paths import check_output_dir

    try:
        check_output_dir(out)
        counts = export_store(db, out, fmt=fmt, campaign=name)
    except ValueError as exc:  # StoreError, OutputPathError
        _fail(str(exc))
    table = Table("table", "rows", f"file ({fmt})", title=f"exported {db} → {out}")
    for table_name, rows in counts.items():
        table.add_row(table_name, str(rows), str(out / f"{table_name}.{fmt}"))
    console.print(table)
