"""Section 9: the cost profile (`capture --passes profile`; the paper's Table 4 and Figure 1b).

Per verification length w, the device time of one pass by module (GDN, softmax attention, MoE,
other) and each part's share, beside the pass's latency and the drafter's pass; and the latency of
single verification calls against the distinct (layer, expert) pairs they route to, with the
least-squares line and Pearson's r (the paper: 0.999)."""

from __future__ import annotations

import numpy as np
import polars as pl

from . import plots
from .inputs import ReportInputs
from .result import Figure, Section

PARTS = ("gdn", "attention", "moe", "other")


def profile_section(inputs: ReportInputs) -> Section:
    section = Section("profile", "9. Cost profile of a verification pass by module")
    run_id = inputs.run_id("profile")
    if run_id is None:
        return section.missing(inputs.missing_pass("profile"))
    rows = inputs.frame("SELECT w, part, kernel_us, kernels, latency_us, context_tokens, attribution FROM cost_profile "
                        "WHERE run_id = ? ORDER BY w, part", [run_id])
    calls = inputs.frame("SELECT call_idx, w, distinct_pairs, latency_us FROM profile_calls WHERE run_id = ? "
                         "ORDER BY call_idx", [run_id])
    target = rows.filter(pl.col("part") != "drafter")
    if target.is_empty():
        return section.missing(f"the profile run of campaign {inputs.campaign!r} has no rows")
    by_w = (target.pivot(on="part", index="w", values="kernel_us").sort("w")
            .join(target.group_by("w").agg(latency_us=pl.col("latency_us").first(),
                                           kernels=pl.col("kernels").sum()), on="w"))
    by_w = by_w.with_columns(kernel_us=pl.sum_horizontal(*PARTS))
    by_w = by_w.select(
        "w", "latency_us", "kernel_us", "kernels", *PARTS,
        *(((pl.col(p) / pl.col("kernel_us")) * 100).alias(f"{p}_pct") for p in PARTS)).sort("w")
    section.tables = {"by_w": by_w}
    drafter = rows.filter(pl.col("part") == "drafter")
    if not drafter.is_empty():
        section.tables["drafter"] = drafter.select("w", "kernel_us", "kernels", "latency_us")
    section.values.update(attribution=rows["attribution"][0], context_tokens=int(rows["context_tokens"][0]),
                          device_time="kernel" if rows["attribution"][0] == "gpu ranges" else "CPU operator")
    line = None
    if len(calls) > 2 and calls["distinct_pairs"].n_unique() > 1:
        x, y = calls["distinct_pairs"].to_numpy().astype(float), calls["latency_us"].to_numpy()
        slope, intercept = np.polyfit(x, y, 1)
        r = float(np.corrcoef(x, y)[0, 1])
        section.values.update(pearson_r=r, us_per_pair=float(slope), intercept_us=float(intercept), calls=len(calls))
        line = (float(slope), float(intercept), r)
        section.tables["calls"] = calls
    largest = by_w.row(-1, named=True)
    section.headline = (f"w = {largest['w']}: MoE {largest['moe_pct']:.0f} %, GDN {largest['gdn_pct']:.0f} %, "
                        f"attention {largest['attention_pct']:.0f} % of {section.values['device_time']} time"
                        + (f"; latency vs distinct pairs r = {section.values['pearson_r']:.3f}" if line else ""))
    caption = (f"Left: {section.values['device_time']} time of one pass by module per w (context "
               f"{section.values['context_tokens']} tokens; attribution: {section.values['attribution']}), the "
               "pass's latency as dots. Right: latency of single verification calls against their distinct "
               "(layer, expert) pairs.")
    section.figures = [Figure(caption, plots.profile(by_w, PARTS, calls if line else None, line))]
    if line is None:
        section.partial("fewer than three profiled calls with different distinct-pair counts: no correlation")
    return section
