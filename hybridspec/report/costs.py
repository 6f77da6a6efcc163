"""Sections 3–7: the latency fits and ρ against the measurements behind them (DESIGN A.9).

3. C_tgt: median (the fit's statistic), quartiles and mean round latency per executed length of
   the fixed-length pass (untruncated rounds, as the fit) against the artifact's fixed cost +
   C_tgt(w), with residuals of the medians.
4. s: Stage-0 latency against u; 5. η: MoE latency against distinct experts. The line drawn is
   the artifact's slope through the mean point of the per-x medians (the fit's intercept).
6. n̄_all(w0 | n): the artifact's table with the routing run's cell counts (cells under 30 use
   the per-position linear fit, DESIGN A.9).
7. Dinkelbach's iterations from the artifact's fit diagnostics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..fitters.routing import MIN_CELL
from . import plots
from .inputs import ReportInputs
from .result import Figure, Section


def cost_section(inputs: ReportInputs) -> Section:
    section = Section("cost", "3. Target latency per round against the verification length (C_tgt)")
    run_id = inputs.run_id("fixed")
    if run_id is None:
        return section.missing(inputs.missing_pass("fixed"))
    samples = inputs.frame("SELECT executed_w AS w, latency_us / 1e3 AS latency_ms FROM fixed_length_timings "
                           "WHERE run_id = ? AND NOT truncated AND w >= 2 ORDER BY w, prompt_id, round_idx", [run_id])
    if samples.is_empty():
        return section.missing(f"the fixed run of campaign {inputs.campaign!r} has no untruncated rounds")
    table = samples.group_by("w").agg(rounds=pl.len(), median_ms=pl.col("latency_ms").median(),
                                      q25_ms=pl.col("latency_ms").quantile(0.25, "linear"),
                                      q75_ms=pl.col("latency_ms").quantile(0.75, "linear"),
                                      mean_ms=pl.col("latency_ms").mean(), std_ms=pl.col("latency_ms").std()).sort("w")
    curve = None
    if inputs.params is not None:
        p = inputs.params
        fitted = [(p.fixed_cost + p.cost[w]) * 1e3 if w < len(p.cost) else None for w in table["w"]]
        table = table.with_columns(fit_ms=pl.Series(fitted, dtype=pl.Float64))
        table = table.with_columns(residual_ms=pl.col("median_ms") - pl.col("fit_ms"))
        grid = np.arange(2, p.draft_len + 2)
        curve = (grid, np.array([(p.fixed_cost + p.cost[w]) * 1e3 for w in grid]))
        cost = inputs.meta["diagnostics"].get("cost", {})
        section.values = {"fixed_cost_ms": p.fixed_cost * 1e3, "r2": cost.get("r2")}
        if cost.get("coef"):  # latency = a + b·w + c·w² (seconds), 95 % intervals
            low, high = zip(*cost["conf_int"])
            if cost.get("constrained"):  # the intervals are the unconstrained fit's: not shown beside this one
                low = high = [float("nan")] * 3
            section.tables["fit"] = pl.DataFrame({"term": ["a (fixed)", "b · w", "c · w²"],
                                                  "coef_ms": [v * 1e3 for v in cost["coef"]],
                                                  "ci_low_ms": [v * 1e3 for v in low],
                                                  "ci_high_ms": [v * 1e3 for v in high]})
        W = p.draft_len + 1
        section.headline = (f"fixed {p.fixed_cost * 1e3:.2f} ms; C_tgt(2) {p.cost[2] * 1e3:.2f} ms → "
                            f"C_tgt({W}) {p.cost[W] * 1e3:.2f} ms; R² {cost.get('r2', 0):.3f}"
                            + ("; refitted as non-decreasing (see the warnings)" if cost.get("constrained") else ""))
    else:
        section.partial(inputs.missing_artifact("the quadratic fit"))
    section.tables = {"per_length": table, **section.tables}
    section.figures = [Figure("Round latency of the fixed-length pass per executed length w, with the fit",
                              plots.cost(samples, table, curve))]
    section.headline = section.headline or f"{len(table)} lengths, {len(samples)} rounds"
    return section


@dataclass(frozen=True)
class SlopeSpec:
    """How a slope section names its x axis and its fitted line."""

    x: str  # the column of x
    xlabel: str
    name: str  # the fitted symbol
    unit: str  # one step of x
    title: str  # of the plot
    caption: str


STAGE0 = SlopeSpec("u", "Stage-0 tokens u", "s", "token", "Stage 0 (Layer-0 GDN + router) latency per call",
                   "Layer-0 GDN + router latency per call against u: samples, means and the slope s")
MOE = SlopeSpec("experts", "distinct experts", "η", "expert",
                "One MoE layer's expert computation, 16 rows × top-k assignments fixed",
                "MoE layer latency against the number of distinct experts: samples, means and the slope η")


def _slope_section(section: Section, spec: SlopeSpec, samples: pl.DataFrame, slope: float | None,
                   diagnostics: dict) -> Section:
    """Per-x means of the latency samples; with a fitted slope (seconds per unit) the line and residuals."""
    x = spec.x
    table = samples.group_by(x).agg(samples=pl.len(), median_us=pl.col("latency_us").median(),
                                    q25_us=pl.col("latency_us").quantile(0.25, "linear"),
                                    q75_us=pl.col("latency_us").quantile(0.75, "linear"),
                                    mean_us=pl.col("latency_us").mean(), std_us=pl.col("latency_us").std()).sort(x)
    xs, ys = samples[x].to_numpy().astype(float), samples["latency_us"].to_numpy()
    line = None
    if slope is not None:
        slope_us = slope * 1e6
        # least squares over the per-x medians passes through their mean point
        intercept = float(table["median_us"].mean() - slope_us * table[x].cast(pl.Float64).mean())
        table = table.with_columns(fit_us=intercept + slope_us * pl.col(x))
        table = table.with_columns(residual_us=pl.col("median_us") - pl.col("fit_us"))
        line = (slope_us, intercept, f"fit: {spec.name} = {slope_us:.2f} µs per {spec.unit}")
        low, high = (v * 1e6 for v in diagnostics.get("conf_int", (np.nan, np.nan)))
        section.values.update(slope_us=slope_us, slope_ci_low_us=low, slope_ci_high_us=high,
                              intercept_us=intercept, r2=diagnostics.get("r2"))
    section.values["correlation"] = float(np.corrcoef(xs, ys)[0, 1]) if len(np.unique(xs)) > 1 else None
    section.tables = {"per_x": table}
    section.figures = [Figure(spec.caption, plots.slope(samples, table, line, x=x, xlabel=spec.xlabel,
                                                        title=spec.title))]
    return section


def _timed_pass_section(inputs: ReportInputs, section: Section, pass_name: str, sql: str, spec: SlopeSpec,
                        slope: float | None, diagnostics: dict) -> Section | None:
    """The samples of `pass_name`'s run through `_slope_section`; None when the run or its rows are missing
    (then `section` says so)."""
    run_id = inputs.run_id(pass_name)
    if run_id is None:
        section.missing(inputs.missing_pass(pass_name))
        return None
    samples = inputs.frame(sql, [run_id])
    if samples.is_empty():
        section.missing(f"the {pass_name} run of campaign {inputs.campaign!r} has no samples")
        return None
    return _slope_section(section, spec, samples, slope, diagnostics)


def stage0_section(inputs: ReportInputs) -> Section:
    section = Section("stage0", "4. Stage-0 latency against the Stage-0 tokens u (s)")
    slope = inputs.params.s if inputs.params else None
    diagnostics = (inputs.meta or {}).get("diagnostics", {}).get("s", {})
    if _timed_pass_section(inputs, section, "stage0", "SELECT u, latency_us FROM stage0_timings WHERE run_id = ? "
                           "ORDER BY u, sample_idx", STAGE0, slope, diagnostics) is None:
        return section
    if slope is None:
        return section.partial(inputs.missing_artifact("the fitted slope s"))
    section.headline = f"s = {section.values['slope_us']:.2f} µs/token (R² {section.values['r2']:.3f})"
    return section


def moe_section(inputs: ReportInputs) -> Section:
    section = Section("moe", "5. MoE layer latency against distinct experts (η)")
    slope = inputs.params.eta if inputs.params else None
    diagnostics = (inputs.meta or {}).get("diagnostics", {}).get("eta", {})
    if _timed_pass_section(inputs, section, "moe", "SELECT n_distinct_experts AS experts, latency_us FROM moe_bench "
                           "WHERE run_id = ? ORDER BY experts, sample_idx", MOE, slope, diagnostics) is None:
        return section
    section.values["fit_correlation"] = diagnostics.get("correlation")
    if slope is None:
        return section.partial(inputs.missing_artifact("the fitted slope η"))
    section.headline = f"η = {section.values['slope_us']:.2f} µs/expert, r = {section.values['correlation']:.3f}"
    return section


def routing_section(inputs: ReportInputs) -> Section:
    section = Section("routing", "6. Routing table n̄_all(w0 | n) with cell counts")
    run_id = inputs.run_id("routing")
    if run_id is None:
        return section.missing(inputs.missing_pass("routing"))
    counts = inputs.frame("SELECT position AS w0, new_l0_experts AS n, count(*) AS tokens FROM routing_positions "
                          "WHERE run_id = ? GROUP BY ALL ORDER BY w0, n", [run_id])
    if counts.is_empty():
        return section.missing(f"the routing run of campaign {inputs.campaign!r} has no rows")
    D = int(counts["w0"].max())
    if inputs.params is None:
        top_k = int(counts["n"].max())
    else:
        top_k = len(inputs.params.nbar_cond[0]) - 1
    grid = pl.DataFrame({"w0": np.repeat(np.arange(1, D + 1), top_k + 1), "n": np.tile(np.arange(top_k + 1), D)})
    table = grid.join(counts, on=["w0", "n"], how="left").with_columns(pl.col("tokens").fill_null(0))
    table = table.with_columns(thin=pl.col("tokens") < MIN_CELL)
    if inputs.params is not None:
        cond = np.asarray(inputs.params.nbar_cond)
        table = table.with_columns(nbar_cond=pl.Series([float(cond[w, n]) for w, n in zip(table["w0"], table["n"])]))
        stored = np.asarray(inputs.meta["diagnostics"].get("routing_cell_counts", []))
        mine = np.zeros_like(stored) if stored.size else None
        if mine is not None:
            for w, n, c in counts.iter_rows():
                if w < mine.shape[0] and n < mine.shape[1]:
                    mine[w, n] = c
            section.values["counts_match_artifact"] = bool(np.array_equal(mine, stored))
            if not section.values["counts_match_artifact"]:
                section.partial("the routing run's cell counts differ from the artifact's (fitted on another store?)")
        section.tables["nbar_all"] = pl.DataFrame({"w0": np.arange(1, D + 1),
                                                   "nbar_all": [inputs.params.nbar_all[w] for w in range(1, D + 1)]})
    else:
        section.partial(inputs.missing_artifact("the n̄_all values"))
    section.tables = {"cells": table, **section.tables}
    thin = int(table["thin"].sum())
    section.values.update(min_cell=MIN_CELL, thin_cells=thin, cells=len(table))
    section.figures = [Figure(f"n̄_all(w0 | n): new (layer, expert) pairs of the token at w0 + 1 when it adds n new "
                              f"Layer-0 experts; faded cells (*) have fewer than {MIN_CELL} tokens (linear fit)",
                              plots.routing(table, D, top_k, MIN_CELL))]
    section.headline = f"{len(table)} cells, {thin} under {MIN_CELL} tokens (linear fit)"
    return section


def dinkelbach_section(inputs: ReportInputs) -> Section:
    section = Section("dinkelbach", "7. Dinkelbach's iterations for ρ")
    if inputs.meta is None:
        return section.missing(inputs.missing_artifact("ρ's iterations (fit diagnostics)"))
    iterations = inputs.meta.get("diagnostics", {}).get("dinkelbach")
    if not iterations:
        return section.missing(f"{inputs.artifact_path}: the fit diagnostics hold no Dinkelbach iterations")
    table = pl.DataFrame(iterations).select("iteration", "rho", "next_rho", "mean_w0")
    section.tables = {"iterations": table}
    section.values = {"rho": inputs.meta["rho"], "iterations": len(table)}
    section.figures = [Figure("ρ per iteration (start: always verify W) and the selector's mean w0",
                              plots.dinkelbach(table, inputs.meta["rho"]))]
    section.headline = f"ρ = {inputs.meta['rho']:.2f} tokens/s after {len(table)} iterations"
    return section
