"""The report's figures: each function takes a section's tables and returns PNG bytes.

matplotlib's object API on the Agg canvas (no pyplot, no global backend state), one figure per
call, closed by garbage collection."""

from __future__ import annotations

import io
import math

import numpy as np
import polars as pl
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

DPI = 96
COLORS = {"raw": "#888888", "isotonic": "#1f77b4", "full": "#d62728", "measured": "#1f77b4",
          "estimated": "#ff7f0e"}


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def reliability(bins: pl.DataFrame, positions: pl.DataFrame, names: list[str]) -> bytes:
    """A grid of reliability diagrams, one per draft position."""
    D = len(positions)
    cols = min(5, D)
    rows = math.ceil(D / cols)
    fig = Figure(figsize=(3.0 * cols, 2.7 * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True)
    for k, ax in enumerate(axes.flat):
        if k >= D:
            ax.set_visible(False)
            continue
        info = positions.row(k, named=True)
        ax.plot([0, 1], [0, 1], color="#bbbbbb", lw=1, ls="--")
        for name in names:
            b = bins.filter((pl.col("position") == k + 1) & (pl.col("estimate") == name)) if len(bins) else bins
            if len(b):  # observed rate with its 95 % Wilson interval; the bin's row count beside the point
                x, y = b["mean_predicted"].to_numpy(), b["observed"].to_numpy()
                err = np.clip(np.vstack((y - b["ci_low"].to_numpy(), b["ci_high"].to_numpy() - y)), 0, None)
                ax.errorbar(x, y, yerr=err, marker="o", ms=3, lw=1.2, elinewidth=0.8, capsize=1.5,
                            color=COLORS[name], label=name)
                if name == names[-1]:
                    for xi, yi, n in zip(x, y, b["rows"].to_list()):
                        ax.annotate(str(n), (xi, yi), xytext=(2, -7), textcoords="offset points", fontsize=5.5,
                                    color=COLORS[name])
        warn = info["too_few"]
        ax.set_title(f"i = {k + 1}  (n = {info['rows']}{', too few' if warn else ''})", fontsize=9,
                     color="#c00000" if warn else "black")
        if warn:
            ax.set_facecolor("#fff0f0")
        if not info["rows"]:
            ax.text(0.5, 0.5, "no rows", ha="center", va="center", color="#c00000", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("predicted P(A_D ≥ i | A_D ≥ i−1)", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("observed rate", fontsize=8)
    handles = [Patch(color=COLORS[n], label=n) for n in names] + [Patch(color="#bbbbbb", label="perfect calibration")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9)
    fig.suptitle("Reliability diagrams per draft position (10 equal-width bins of the prediction; bars: 95 % "
                 f"Wilson interval of the observed rate; numbers: rows per bin of `{names[-1]}`)", fontsize=10)
    return _png(fig)


def acceptance(by_position: pl.DataFrame, al: pl.DataFrame) -> bytes:
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2.2, 1))
    for category in by_position["category"].unique(maintain_order=True):
        part = by_position.filter(pl.col("category") == category)
        bold = category == "all"
        left.plot(part["position"], part["p_accept"], marker="o", ms=3, lw=2.5 if bold else 1.2,
                  color="black" if bold else None, label=f"{category} ({part['rounds'][0]} rounds)")
    left.set(xlabel="draft position i", ylabel="P(A_D ≥ i)", title="Prefix acceptance per position (capture rounds)",
             ylim=(0, 1))
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.bar(al["category"], al["al"], color=["black" if c == "all" else "#1f77b4" for c in al["category"]])
    for x, v in enumerate(al["al"]):
        right.annotate(f"{v:.2f}", (x, v), ha="center", va="bottom", fontsize=8)
    right.set(ylabel="AL (emitted tokens / round)", title="Acceptance length under `full`")
    right.tick_params(axis="x", labelrotation=30, labelsize=8)
    return _png(fig)


def cost(samples: pl.DataFrame, table: pl.DataFrame, curve) -> bytes:
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2, 1))
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(samples))
    left.scatter(samples["w"].to_numpy() + jitter, samples["latency_ms"], s=4, alpha=0.25, color="#888888",
                 label="rounds")
    spread = np.vstack(((table["median_ms"] - table["q25_ms"]).to_numpy(), (table["q75_ms"] - table["median_ms"]).to_numpy()))
    left.errorbar(table["w"], table["median_ms"], yerr=spread, fmt="o", color="#1f77b4", capsize=3,
                  label="median and quartiles (the fit's statistic)")
    if curve is not None:
        left.plot(curve[0], curve[1], color="#d62728", lw=1.8, label="fit: fixed + C_tgt(w)")
        right.axhline(0, color="#bbbbbb", lw=1)
        right.bar(table["w"], table["residual_ms"], color="#d62728")
        right.set(xlabel="executed length w (tokens)", ylabel="median − fit (ms)", title="Residuals of the medians")
        _integer_ticks(right, table["w"])
    else:
        right.text(0.5, 0.5, "no artifact: no fit", ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    left.set(xlabel="executed length w (tokens, counting the anchor)", ylabel="round latency (ms)",
             title="Fixed-length pass: round latency per w")
    _clip_outliers(left, samples["latency_ms"].to_numpy(), table["median_ms"].to_numpy())
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    return _png(fig)


def _clip_outliers(ax, samples: np.ndarray, means: np.ndarray) -> None:
    """y range of the central 99 % of samples (and every median), so a few slow outliers do not
    flatten the curve; the table keeps every sample."""
    low, high = np.percentile(samples, [0.5, 99.5])
    low, high = min(low, means.min()), max(high, means.max())
    pad = 0.08 * (high - low or 1.0)
    ax.set_ylim(low - pad, high + pad)


def _integer_ticks(ax, xs: pl.Series) -> None:
    """Ticks at the measured x values (every other one beyond 12)."""
    values = xs.to_list()
    ax.set_xticks(values[:: 1 if len(values) <= 12 else 2])


def slope(samples: pl.DataFrame, table: pl.DataFrame, line, *, x: str, xlabel: str, title: str) -> bytes:
    """Latency samples and per-x medians with quartiles against x; `line` = (slope µs, intercept µs,
    label) or None."""
    fig = Figure(figsize=(12, 4.0), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(2, 1))
    left.scatter(samples[x], samples["latency_us"], s=6, alpha=0.3, color="#888888", label="samples")
    spread = np.vstack(((table["median_us"] - table["q25_us"]).to_numpy(), (table["q75_us"] - table["median_us"]).to_numpy()))
    left.errorbar(table[x], table["median_us"], yerr=spread, fmt="o", color="#1f77b4", capsize=3,
                  label="median and quartiles (the fit's statistic)")
    if line is not None:
        grid = np.array([table[x].min(), table[x].max()], float)
        left.plot(grid, line[1] + line[0] * grid, color="#d62728", lw=1.8, label=line[2])
        right.axhline(0, color="#bbbbbb", lw=1)
        right.bar(table[x], table["residual_us"], color="#d62728")
        right.set(xlabel=xlabel, ylabel="median − fit (µs)", title="Residuals of the medians")
        _integer_ticks(right, table[x])
    else:
        right.text(0.5, 0.5, "no artifact: no fit", ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    left.set(xlabel=xlabel, ylabel="latency (µs)", title=title)
    _clip_outliers(left, samples["latency_us"].to_numpy(), table["median_us"].to_numpy())
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    return _png(fig)


def routing(cells: pl.DataFrame, D: int, top_k: int, min_cell: int) -> bytes:
    """Heatmap of n̄_all(w0 | n) (or of the cell counts without an artifact); thin cells faded."""
    counts = np.zeros((D, top_k + 1), int)
    values = np.full((D, top_k + 1), np.nan)
    has_values = "nbar_cond" in cells.columns
    for row in cells.iter_rows(named=True):
        counts[row["w0"] - 1, row["n"]] = row["tokens"]
        if has_values:
            values[row["w0"] - 1, row["n"]] = row["nbar_cond"]
    shown = values if has_values else counts.astype(float)
    fig = Figure(figsize=(4.5 + 1.6 * (top_k + 1), 0.42 * D + 1.8), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(shown, aspect="auto", cmap="viridis", extent=(-0.5, top_k + 0.5, D + 0.5, 0.5))
    fig.colorbar(image, ax=ax, label="n̄_all(w0 | n) (new (layer, expert) pairs)" if has_values else "tokens")
    low, high = np.nanmin(shown), np.nanmax(shown)
    for w0 in range(1, D + 1):
        for n in range(top_k + 1):
            c, v = counts[w0 - 1, n], shown[w0 - 1, n]
            thin = c < min_cell
            if thin:  # the fit used the per-position linear fit here: faded, marked *
                ax.add_patch(Rectangle((n - 0.5, w0 - 0.5), 1, 1, color="white", alpha=0.55, lw=0))
            dark = not thin and (high - low) > 0 and (v - low) / (high - low) < 0.6
            text = (f"{v:.2f}  ({c})" if has_values else f"{c}") + (" *" if thin else "")
            ax.text(n, w0, text, ha="center", va="center", fontsize=8.5, color="white" if dark else "black")
    ax.set_xticks(range(top_k + 1))
    ax.set_yticks(range(1, D + 1))
    ax.set(xlabel="n: new Layer-0 experts of the added token", ylabel="w0 (the added token sits at w0 + 1)",
           title=f"n̄_all(w0 | n)  (token count);  * faded: under {min_cell} tokens, linear fit")
    return _png(fig)


def dinkelbach(table: pl.DataFrame, rho: float) -> bytes:
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.plot(table["iteration"], table["rho"], "o-", color="#1f77b4", label="ρ used by the selector")
    left.plot(table["iteration"], table["next_rho"], "s--", color="#ff7f0e", label="pooled throughput at that ρ")
    left.axhline(rho, color="#bbbbbb", lw=1, label=f"fixed point ρ = {rho:.2f}")
    left.set(xlabel="iteration", ylabel="ρ (tokens / s)", title="ρ per iteration (start: always verify W)")
    right.plot(table["iteration"], table["mean_w0"], "^-", color="#2ca02c")
    right.set(xlabel="iteration", ylabel="mean selected w0 (tokens)", title="Selector's mean w0 at that ρ")
    for ax in (left, right):
        ax.set_xticks(table["iteration"].to_list())
        ax.grid(alpha=0.3)
    left.legend(fontsize=8, loc="best")
    return _png(fig)


def lengths(table: pl.DataFrame, summary: pl.DataFrame, max_w: int) -> bytes:
    """Executed verification lengths: fraction of rounds per w, one bar group per series."""
    series = summary["series"].to_list()
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(series))
    for k, name in enumerate(series):
        part = table.filter(pl.col("series") == name)
        mean_w = summary.filter(pl.col("series") == name)["mean_w"][0]
        ax.bar(part["w"].to_numpy() - 0.4 + width * (k + 0.5), part["fraction"], width=width,
               label=f"{name} (mean w over its rounds {mean_w:.2f})")
    ax.set_xticks(range(1, max_w + 1))
    ax.set(xlabel="executed verification length w (tokens, counting the anchor)", ylabel="fraction of rounds",
           title="Executed verification lengths")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3, axis="y")
    return _png(fig)


def policies(table: pl.DataFrame, metrics: list[tuple[str, dict[str, str]]]) -> bytes:
    """Grouped bars per policy: for each (label, {side: column}), one bar per side present."""
    names = table["policy"].to_list()
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    x = np.arange(len(names))
    for ax, (label, sides) in zip(axes, metrics):
        width = 0.8 / max(1, len(sides))
        for k, (side, column) in enumerate(sides.items()):
            values = table[column].cast(pl.Float64).fill_null(np.nan).to_numpy()
            ax.bar(x - 0.4 + width * (k + 0.5), values, width=width, color=COLORS[side], label=side)
        ax.set_xticks(x, names, rotation=30, fontsize=8)
        ax.set(title=label, ylabel=label)
        ax.grid(alpha=0.3, axis="y")
    sides = list(metrics[0][1])
    fig.legend(handles=[Patch(color=COLORS[side], label=side) for side in sides], loc="outside lower center",
               ncols=len(sides), fontsize=9)
    fig.suptitle("Policies, category “all” (mean over categories)")
    return _png(fig)


def runs(table: pl.DataFrame) -> bytes:
    """Wall-clock duration of every run in the store."""
    labels = [f"{n} / {p}" for n, p in zip(table["name"], table["pass"])]
    fig = Figure(figsize=(10, 0.35 * len(labels) + 1.4), layout="constrained")
    ax = fig.subplots()
    ax.barh(labels, table["seconds"].fill_null(0), color=["#1f77b4" if s == "finished" else "#ff7f0e"
                                                           for s in table["status"]])
    ax.invert_yaxis()
    ax.set(xlabel="wall-clock seconds (started → finished)", title="Runs in the store (orange: not finished)")
    ax.grid(alpha=0.3, axis="x")
    return _png(fig)


def profile(by_w: pl.DataFrame, parts: tuple[str, ...], calls: pl.DataFrame | None, line) -> bytes:
    """Stacked device time by part per w with the pass latency; latency against distinct pairs with
    `line` = (slope, intercept, r) or None."""
    fig = Figure(figsize=(12, 4.0), layout="constrained")
    left, right = fig.subplots(1, 2)
    colors = {"gdn": "#2ca02c", "attention": "#9467bd", "moe": "#d62728", "other": "#888888"}
    bottom = np.zeros(len(by_w))
    ws = by_w["w"].to_numpy()
    for part in parts:
        values = by_w[part].to_numpy() / 1e3
        left.bar(ws, values, bottom=bottom, color=colors.get(part), label=part)
        bottom += values
    left.plot(ws, by_w["latency_us"].to_numpy() / 1e3, "o", color="black", label="pass latency")
    left.set(xlabel="verification length w", ylabel="ms", title="One verification pass by module")
    _integer_ticks(left, by_w["w"])
    left.legend(fontsize=8)
    left.grid(alpha=0.3, axis="y")
    if calls is None:
        right.text(0.5, 0.5, "no profiled calls", ha="center", va="center", transform=right.transAxes)
        right.set_axis_off()
    else:
        x = calls["distinct_pairs"].to_numpy()
        right.scatter(x, calls["latency_us"].to_numpy() / 1e3, s=12, c=calls["w"].to_numpy(), cmap="viridis")
        grid = np.array([x.min(), x.max()], float)
        right.plot(grid, (line[1] + line[0] * grid) / 1e3, color="#d62728",
                   label=f"{line[1] / 1e3:.2f} ms + {line[0]:.2f} µs per pair (r = {line[2]:.3f})")
        right.set(xlabel="distinct (layer, expert) pairs", ylabel="latency (ms)",
                  title="Verification latency against distinct experts")
        right.legend(fontsize=8)
        right.grid(alpha=0.3)
    return _png(fig)
