"""What `build_report` returns: the sections, each with its status, the numbers behind it (tables
as polars frames, scalars) and its plots as PNG bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

OK, POOR_FIT, PARTIAL, MISSING = "ok", "poor fit", "partial", "missing"
PRESENT = OK


@dataclass
class Figure:
    caption: str
    png: bytes


@dataclass
class Section:
    """One section of the report. `status`: ok; poor fit (a fit-quality check of the artifact that
    belongs to this section failed: `failed_checks` holds their lines, shown first); partial
    (shown; `note` names what is missing, e.g. the artifact); missing (`note` names the missing
    data and the command that records it)."""

    key: str
    title: str
    status: str = PRESENT
    note: str = ""
    headline: str = ""  # one line for the terminal summary
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    values: dict[str, object] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    failed_checks: list[str] = field(default_factory=list)

    def missing(self, note: str) -> "Section":
        self.status, self.note = MISSING, note
        return self

    def poor_fit(self, lines: list[str]) -> "Section":
        self.failed_checks += lines
        if self.status != MISSING:
            self.status = POOR_FIT
        return self

    def partial(self, note: str) -> "Section":
        if self.status not in (MISSING, POOR_FIT):
            self.status = PARTIAL
        self.note = f"{self.note}; {note}" if self.note else note
        return self


@dataclass
class ReportResult:
    path: Path  # out/index.html
    db: Path
    campaign: str | None
    artifact: Path | None
    sections: list[Section]
    checks: list = field(default_factory=list)  # fitters.checks.Check of the artifact; empty without one
    other_model: str = ""  # the artifact was fitted for another model or drafter: a sentence naming both ids and
    #                        what the report does about it (`build_report`'s `force`); "" otherwise

    @property
    def failed_checks(self) -> list:
        return [c for c in self.checks if c.failed]

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(f"no section {key!r} (sections: {', '.join(s.key for s in self.sections)})")
