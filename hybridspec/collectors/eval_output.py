"""Terminal output of `hybridspec eval`: the paper's Table 1 layout (rows: the categories and their
average; per policy a column group TPS, SR, AL, w) for the measured rows, the offline estimates and
their difference, then the exactness summary (outputs that differ from `ar` in red)."""

from __future__ import annotations

import polars as pl
from rich.console import Console
from rich.table import Table

from ..evaluation.offline import AVERAGE
from ..evaluation.tables import COLUMNS
from .evaluate import EvalResult
PADDING = 3  # a rich column's padding and border


def table1(frame: pl.DataFrame, policies: tuple[str, ...], title: str, width: int, *, signed: bool = False
           ) -> list[Table]:
    """`frame` (policy, category, tps, sr, al, mean_w) as Table-1 tables, as many policies per table as fit."""
    categories = [c for c in dict.fromkeys(frame["category"].to_list()) if c != AVERAGE] + [AVERAGE]
    labels = ["Average" if c == AVERAGE else c for c in categories]
    cells = {(r["policy"], r["category"]): r for r in frame.iter_rows(named=True)}
    groups = {p: [[_number(cells[p, c][key], fmt, signed) if (p, c) in cells else "–" for key, _, fmt in COLUMNS]
                  for c in categories] for p in policies if any(k[0] == p for k in cells)}
    tables, chunk, used = [], [], max(map(len, labels + ["category"])) + PADDING + 1
    for policy, rows in groups.items():
        need = sum(max(len(h), *(len(r[i]) for r in rows)) + PADDING for i, (_, h, _) in enumerate(COLUMNS))
        need += max(0, len(policy) - max(len(r[0]) for r in rows))
        if chunk and used + need > width:
            tables.append(_table(title, len(tables), chunk, groups, labels))
            chunk, used = [], max(map(len, labels + ["category"])) + PADDING + 1
        chunk.append(policy)
        used += need
    if chunk:
        tables.append(_table(title, len(tables), chunk, groups, labels))
    return tables


def _table(title: str, index: int, chunk: list[str], groups: dict, labels: list[str]) -> Table:
    table = Table(title=title if index == 0 else f"{title} (continued)")
    table.add_column("category", no_wrap=True)
    for policy in chunk:
        for i, (_, header, _) in enumerate(COLUMNS):
            table.add_column(f"{policy if i == 0 else ''}\n{header}", justify="right", no_wrap=True)
    for k, label in enumerate(labels):
        table.add_row(label, *(v for p in chunk for v in groups[p][k]), end_section=k == len(labels) - 2)
    return table


def _number(value: float, fmt: str, signed: bool) -> str:
    text = fmt.format(value)
    return ("+" + text if value >= 0 else text) if signed else text


def print_eval(console: Console, result: EvalResult) -> None:
    """The measured table, the estimates and their difference, the exactness summary, and notes."""
    width = console.width
    for table in table1(result.measured, result.policies, f"eval {result.run_id}: measured (pooled per category)",
                        width):
        console.print(table)
    if result.comparison is not None:
        for table in table1(result.estimates, result.policies, "offline estimates (capture rounds + artifact)", width):
            console.print(table)
        diff = result.comparison.select("policy", "category", *(pl.col(f"{m}_diff").alias(m) for m, _, _ in COLUMNS))
        for table in table1(diff, result.policies, "estimate − measured", width, signed=True):
            console.print(table)
    for note in result.notes:
        console.print(f"[yellow]{note}[/]")
    for line, ok in exactness_lines(result):
        console.print(f"[green]{line}[/]" if ok else f"[bold red]{line}[/]", soft_wrap=True)


def exactness_lines(result: EvalResult) -> list[tuple[str, bool]]:
    """(line, fine) pairs: one line per policy whose greedy outputs differ from ar's, or one all-clear."""
    if not result.greedy:
        return [("sampled (temperature > 0): outputs are not compared with ar", True)]
    if result.mismatches.is_empty():
        return [(f"every policy's greedy output equals ar's on all {result.prompts} prompts", True)]
    lines = []
    for (policy,), rows in result.mismatches.group_by("policy", maintain_order=True):
        where = ", ".join(f"{p} at {k}" for p, k in zip(rows["prompt_id"], rows["mismatch_position"]))
        lines.append((f"MISMATCH {policy}: {len(rows)} of {result.prompts} outputs differ from ar "
                      f"(prompt at first differing position: {where})", False))
    return lines


def eval_json(result: EvalResult) -> dict:
    """`eval --json`: the run, the measured rows per policy and category (offline.MEASURED_COLUMNS:
    `decode_seconds` measured), the offline estimates of the same categories when the campaign has a
    capture run (ESTIMATE_COLUMNS: `est_seconds` estimated), every output that differs from ar's."""
    return {"run_id": result.run_id, "policies": list(result.policies), "greedy": result.greedy,
            "prompts": result.prompts, "measured": result.measured.to_dicts(),
            "estimates": result.estimates.to_dicts() if result.estimates is not None else None,
            "mismatches": result.mismatches.to_dicts(), "exact": result.greedy and result.mismatches.is_empty(),
            "notes": list(result.notes)}
