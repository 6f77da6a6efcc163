"""Terminal output of `hybridspec fit`: the artifact's id, the fitted scalars, C_tgt(w) and the
acceptance model's held-out scores."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from .campaign import CampaignFit


def print_fit(console: Console, result: CampaignFit, out: Path, meta: dict) -> None:
    """The artifact's id, the fitted scalars, C_tgt(w) and the acceptance model's held-out scores."""
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
