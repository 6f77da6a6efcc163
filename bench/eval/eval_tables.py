"""Markdown tables of an eval run (for bench/results/eval.md): the measured Table 1, the offline
estimates stored beside it and estimate − measured, read from the store (nothing is decoded).

    .venv/bin/python bench/eval/eval_tables.py STORE [--name default]
"""

from __future__ import annotations

import argparse
import json

import polars as pl

from hybridspec.evaluation.offline import AVERAGE, compare_with_measured
from hybridspec.evaluation.tables import COLUMNS, EVAL_PASS, measured_table
from hybridspec.workbench.store import Store, run_id_for


def markdown(frame: pl.DataFrame, policies: list[str], signed: bool = False) -> str:
    """Rows: categories then Average; per policy the column group TPS, SR, AL, w."""
    cells = {(r["policy"], r["category"]): r for r in frame.iter_rows(named=True)}
    categories = sorted({c for _, c in cells if c != AVERAGE}) + [AVERAGE]
    head = "| category | " + " | ".join(f"{p} {h}" for p in policies for _, h, _ in COLUMNS) + " |"
    lines = [head, "|---|" + "---:|" * (len(policies) * len(COLUMNS))]
    for c in categories:
        values = [(("+" if signed and cells[p, c][k] >= 0 else "") + f.format(cells[p, c][k]))
                  for p in policies for k, _, f in COLUMNS]
        lines.append(f"| {'**Average**' if c == AVERAGE else c} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--name", default="default")
    args = parser.parse_args()
    measured = measured_table(args.store, args.name)
    with Store(args.store, read_only=True) as store:
        run = store.run_row(run_id_for(args.name, EVAL_PASS))
        estimates = store.frame("SELECT * FROM offline_estimates WHERE run_id = ?", [run["run_id"]])
    policies = json.loads(run["params"])["policies"]
    for group in (policies[:4], policies[4:]):  # two tables of ≤ 4 policies each stay readable
        print(f"\n### Measured: {', '.join(group)}\n\n" + markdown(measured, group))
        print(f"\n### Offline estimates: {', '.join(group)}\n\n" + markdown(estimates, group))
        diff = compare_with_measured(estimates, measured).select(
            "policy", "category", *(pl.col(f"{k}_diff").alias(k) for k, _, _ in COLUMNS))
        print(f"\n### Estimate − measured: {', '.join(group)}\n\n" + markdown(diff, group, signed=True))
    top = estimates.filter(pl.col("category") == AVERAGE).sort("tps", descending=True).head(5)
    print("\n### Offline estimates, Average rows, the 5 highest estimated TPS (every static length included)\n")
    print("| policy | TPS | SR | AL | w |\n|---|---:|---:|---:|---:|")
    for r in top.iter_rows(named=True):
        print(f"| {r['policy']} | {r['tps']:.1f} | {r['sr']:.2f}× | {r['al']:.2f} | {r['mean_w']:.2f} |")


if __name__ == "__main__":
    main()
