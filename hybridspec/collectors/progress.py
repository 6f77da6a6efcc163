"""Terminal output of `hybridspec capture`: rich progress bars (per pass, per unit) and the closing
summary table. On a non-terminal (logs, pipes) each committed unit is one plain line instead."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from .campaign import PassSummary


class RichReporter:
    def __init__(self, console: Console):
        self.console = console
        self.live = console.is_terminal
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, disable=not self.live)
        self.pass_task = self.unit_task = None

    def __enter__(self) -> "RichReporter":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def pass_started(self, name: str, units: int, already_done: int) -> None:
        for task in (self.pass_task, self.unit_task):
            if task is not None:
                self.progress.remove_task(task)
        self.pass_task = self.progress.add_task(f"[bold]{name}[/]", total=units, completed=already_done)
        self.unit_task = self.progress.add_task("  …", total=1)
        if not self.live:
            self.console.print(f"{name}: {units} units, {already_done} already committed", highlight=False)

    def unit_started(self, name: str, unit: str) -> None:
        self.progress.reset(self.unit_task, total=1, description=f"  {unit}")

    def unit_committed(self, name: str, unit: str, rows: int) -> None:
        self.progress.update(self.unit_task, completed=1)
        self.progress.advance(self.pass_task)
        if not self.live:
            self.console.print(f"{name}: {unit} committed ({rows} rows)", highlight=False, soft_wrap=True)

    def pass_finished(self, summary: PassSummary) -> None:
        if not self.live:
            self.console.print(f"{summary.name}: {summary.status} in {summary.seconds:.1f} s", highlight=False)


def summary_table(summaries: list[PassSummary], db: Path) -> Table:
    table = Table(title=f"capture → {db}")
    for header in ("pass", "status", "units", "resumed", "s"):  # run ids: `SELECT * FROM runs`
        table.add_column(header, no_wrap=True)
    table.add_column("rows", no_wrap=True)
    for s in summaries:
        rows = "\n".join(f"{t} {n}" for t, n in s.rows.items())
        table.add_row(s.name, s.status, str(s.units), str(s.resumed), f"{s.seconds:.0f}", rows)
    return table
