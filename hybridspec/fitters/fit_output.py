"""Terminal output of `hybridspec fit` and `inspect`: the artifact's id, the fitted scalars, C_tgt(w),
the acceptance model's held-out scores and the fit-quality checks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .campaign import CampaignFit
from .checks import FAILED, OK, UNKNOWN, Check

STYLE = {OK: "green", FAILED: "bold red"}


def checks_table(checks: Sequence[Check], title: str = "fit-quality checks") -> Table:
    table = Table("check", "value", "needs", "", title=title)
    for c in checks:
        value = c.detail if c.value is not None or c.status != UNKNOWN else "not recorded"  # a verdict without a number
        table.add_row(c.name, escape(value), escape(c.limit), f"[{STYLE.get(c.status, 'yellow')}]{c.status}[/]")
    return table


def print_fit(console: Console, result: CampaignFit, out: Path | None, meta: dict | None) -> None:
    """The artifact's id (when written), the fitted scalars, C_tgt(w), the held-out scores, the checks."""
    if meta is not None:
        console.print(f"[bold]artifact[/] {out}  ({meta['content_sha256'][:19]}…)")
    console.print(f"ρ = {result.rho:.2f} tokens/s   s = {result.stage0.slope_ * 1e6:.2f} µs/token   "
                  f"η = {result.moe.slope_ * 1e6:.2f} µs/expert (r = {result.moe.correlation_:.3f})   "
                  f"fixed = {result.cost.fixed_cost_ * 1e3:.2f} ms   Dinkelbach iterations {len(result.iterations)}")
    table = result.cost.table(result.draft_len + 1)
    console.print("C_tgt(w) ms: " + "  ".join(f"{w}:{table[w] * 1e3:.2f}" for w in result.lengths))
    metrics = Table("estimate", "log-loss", "Brier", "ECE", "rows", title="acceptance, held-out rounds")
    for name, m in result.metrics.items():
        if "log_loss" not in m:  # full_vs_raw: the paired difference, shown with the check
            continue
        metrics.add_row(name, f"{m['log_loss']:.4f}", f"{m['brier']:.4f}", f"{m['ece']:.4f}", str(m["rows"]))
    console.print(metrics)
    if result.checks:
        console.print(checks_table(result.checks))
        bad = [c for c in result.checks if c.status == FAILED]
        if bad:
            console.print(f"[bold red]{len(bad)} fit-quality check(s) failed[/] — the fit is not fit to decide with "
                          "until these are fixed (re-capture on a quiet machine, more prompts, or another threshold):")
            for check in bad:
                console.print(f"  [red]{escape(check.line())}[/]")
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}")


def fit_json(result: CampaignFit, out: Path | None, meta: dict | None, checks) -> dict:
    """`fit --json`: the artifact (null when nothing was written), the fitted scalars (seconds),
    C_tgt(w), the held-out scores and every check, the failed ones listed by line."""
    from .checks import check_rows

    table = result.cost.table(result.draft_len + 1)
    rows = check_rows(checks)
    return {"artifact": str(out) if meta is not None else None,
            "content_sha256": meta["content_sha256"] if meta is not None else None,
            "written_with_failed_checks": bool(meta is not None and meta["diagnostics"].get("allow_poor_fit")),
            "rho": result.rho, "s": result.stage0.slope_, "eta": result.moe.slope_,
            "fixed_cost": result.cost.fixed_cost_, "draft_len": result.draft_len,
            "cost": {str(w): float(table[w]) for w in result.lengths},
            "dinkelbach_iterations": len(result.iterations), "dinkelbach_converged": result.converged,
            "held_out": result.metrics, "warnings": list(result.warnings), "checks": rows,
            "failed_checks": [r["line"] for r in rows if r["status"] == FAILED]}
