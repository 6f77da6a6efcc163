"""The terminal summary of a report: whose fit an artifact of another model is, every failed
fit-quality check, one row per section, then the policy table when present."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from .result import MISSING, PARTIAL, POOR_FIT, ReportResult

STYLE = {MISSING: "red", PARTIAL: "yellow", POOR_FIT: "bold magenta"}
METRICS = (("al", "AL"), ("mean_w", "mean w"), ("tps", "TPS tok/s"), ("sr", "SR"))


def summary(result: ReportResult) -> Group:
    """Rich renderables: the section table and, when measured or estimated, the policy table."""
    sections = Table("section", "status", "summary / what is missing", title=f"report → {result.path}",
                     expand=False)
    for s in result.sections:
        style = STYLE.get(s.status, "green")
        text = s.headline if s.status != MISSING else s.note
        if s.status == PARTIAL and s.note:
            text = f"{s.headline} [yellow]({s.note})[/]" if s.headline else s.note
        if s.failed_checks:
            text = "; ".join(f"[magenta]{escape(line)}[/]" for line in s.failed_checks) + f"; {text}"
        sections.add_row(s.title, f"[{style}]{s.status}[/]", text)
    parts = [_checks_lines(result), sections]
    policies = result.section("policies").tables.get("policies")
    if policies is not None:
        parts.append(_policy_table(policies.filter(policies["category"] == "all")))
    return Group(*parts)


def _checks_lines(result: ReportResult) -> Text:
    """Whose fit the artifact is when it is another model's, then the fit-quality checks (as the page)."""
    if not result.other_model:
        return _checks_text(result)
    other = Text(result.other_model, style="bold yellow")
    return Text("\n").join([other, _checks_text(result)]) if result.checks else other


def _checks_text(result: ReportResult) -> Text:
    if not result.checks:
        return Text("no artifact: the fit-quality checks did not run", style="yellow")
    failed = result.failed_checks
    if not failed:
        return Text(f"no fit-quality check failed ({len(result.checks)} checks)", style="green")
    lines = [f"{len(failed)} fit-quality check(s) failed:"] + [f"  {c.line()}" for c in failed]
    return Text("\n".join(lines), style="bold magenta")


def _policy_table(overall) -> Table:
    """Category "all": one column per metric, `measured / estimated` when both are known; the title
    names the side(s) shown (a one-sided table has `decode_seconds` when measured, `est_seconds`
    when estimated)."""
    sides = ("measured / estimated" if "al_measured" in overall.columns
             else "measured" if "decode_seconds" in overall.columns else "estimated")
    table = Table("policy", *(label for _, label in METRICS), title=f"policies, all categories ({sides})")
    for row in overall.iter_rows(named=True):
        cells = []
        for metric, _ in METRICS:
            sides = [row[c] for c in (f"{metric}_measured", f"{metric}_estimated") if c in row] or [row[metric]]
            cells.append(" / ".join(f"{v:.3g}" for v in sides))
        table.add_row(row["policy"], *cells)
    return table


def report_json(result: ReportResult) -> dict:
    """`report --json`: the page, each section's status and one-line summary, the failed checks."""
    return {"path": str(result.path.resolve()), "db": str(result.db), "campaign": result.campaign,
            "artifact": str(result.artifact) if result.artifact is not None else None,
            "sections": [{"key": s.key, "title": s.title, "status": s.status, "headline": s.headline,
                          "note": s.note, "failed_checks": list(s.failed_checks)} for s in result.sections],
            "failed_checks": [c.line() for c in result.failed_checks], "other_model": result.other_model}
