"""What `build_report` returns: the sections, each with its status, the numbers behind it (tables
as polars frames, scalars) and its plots as PNG bytes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

PRESENT, PARTIAL, MISSING = "present", "partial", "missing"


@dataclass
class Figure:
    caption: str
    png: bytes


@dataclass
class Section:
    """One section of the report. `status`: present, partial (shown; `note` names what is missing)
    or missing (`note` names the missing data and the command that records it)."""

    key: str
    title: str
    status: str = PRESENT
    note: str = ""
    headline: str = ""  # one line for the terminal summary
    tables: dict[str, pl.DataFrame] = field(default_factory=dict)
    values: dict[str, object] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)

    def missing(self, note: str) -> "Section":
        self.status, self.note = MISSING, note
        return self

    def partial(self, note: str) -> "Section":
        if self.status != MISSING:
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

    def section(self, key: str) -> Section:
        for section in self.sections:
            if section.key == key:
                return section
        raise KeyError(f"no section {key!r} (sections: {', '.join(s.key for s in self.sections)})")
