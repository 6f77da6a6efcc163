"""One self-contained HTML page: inline CSS, every image a base64 PNG `data:` URI, no scripts,
no external files. Long tables and long cells fold into `<details>` (plain HTML)."""

from __future__ import annotations

import base64
import datetime as dt
from html import escape

import polars as pl

from .result import MISSING, PARTIAL, POOR_FIT, ReportResult, Section

FOLD_ROWS = 20  # tables longer than this start folded
FOLD_CHARS = 80  # cells longer than this show their start, the rest folded

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1320px;
       color: #222; line-height: 1.4; padding: 0 16px; }
h1 { margin-bottom: 4px; } h2 { margin-top: 36px; border-bottom: 2px solid #ddd; padding-bottom: 4px; }
.meta { color: #555; font-size: 14px; }
.badge { font-size: 12px; padding: 2px 8px; border-radius: 10px; margin-left: 10px; vertical-align: middle;
         color: white; background: #2e7d32; }
.badge.partial { background: #ef6c00; } .badge.missing { background: #c62828; } .badge.poor-fit { background: #ad1457; }
.failed { background: #fce4ec; border-left: 4px solid #ad1457; padding: 6px 10px; font-size: 14px; margin: 4px 0; }
.checks { background: #f1f8e9; border-left: 4px solid #2e7d32; padding: 6px 10px; font-size: 14px; }
.note { background: #fff8e1; border-left: 4px solid #ef6c00; padding: 6px 10px; font-size: 14px; }
.note.missing { background: #ffebee; border-left-color: #c62828; }
figure { margin: 12px 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { color: #555; font-size: 13px; }
table { border-collapse: collapse; font-size: 12px; margin: 8px 0 16px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; vertical-align: top; }
th { background: #f3f3f3; } td.text { text-align: left; } td.long { max-width: 480px; overflow-wrap: anywhere; }
caption { text-align: left; font-weight: 600; padding: 4px 0; }
summary { cursor: pointer; color: #1565c0; font-size: 13px; }
code { background: #f3f3f3; padding: 0 3px; }
nav ol { columns: 2; font-size: 14px; }
"""


def _number(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:
            return "–"
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.6g}"
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat(sep=" ", timespec="seconds") if isinstance(value, dt.datetime) else value.isoformat()
    return "–" if value is None else str(value)


def _cell(value) -> str:
    text = _number(value)
    numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
    if len(text) > FOLD_CHARS:
        body = f"<details><summary>{escape(text[:FOLD_CHARS])}…</summary>{escape(text)}</details>"
        return f'<td class="text long">{body}</td>'
    if numeric:
        return f"<td>{escape(text)}</td>"
    return f'<td class="text{" long" if len(text) > 40 else ""}">{escape(text)}</td>'


def table(frame: pl.DataFrame, caption: str) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in frame.columns)
    rows = "".join("<tr>" + "".join(_cell(v) for v in row) + "</tr>" for row in frame.iter_rows())
    html = f"<table><caption>{escape(caption)}</caption><tr>{head}</tr>{rows}</table>"
    if frame.height > FOLD_ROWS:
        return f"<details><summary>{escape(caption)}: {frame.height} rows (show)</summary>{html}</details>"
    return html


def image(png: bytes, alt: str) -> str:
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{escape(alt)}">'


def section(s: Section) -> str:
    badge = s.status.replace(" ", "-")
    parts = [f'<h2 id="{s.key}">{escape(s.title)}<span class="badge {badge}">{escape(s.status)}</span></h2>']
    parts += [f'<p class="failed">failed check — {escape(line)}</p>' for line in s.failed_checks]
    if s.note:
        kind = "note missing" if s.status == MISSING else "note"
        parts.append(f'<p class="{kind}">{escape(s.note)}</p>')
    for figure in s.figures:
        parts.append(f"<figure>{image(figure.png, figure.caption)}<figcaption>{escape(figure.caption)}"
                     "</figcaption></figure>")
    scalars = {k: v for k, v in s.values.items() if not isinstance(v, (list, dict)) and not
               (isinstance(v, str) and v in s.note)}  # a value the note already says is not repeated
    if scalars:
        parts.append(table(pl.DataFrame({"name": list(scalars), "value": [_number(v) for v in scalars.values()]}),
                           "values"))
    for name, frame in s.tables.items():
        parts.append(table(frame, name.replace("_", " ")))
    return "\n".join(parts)


def page(result: ReportResult) -> str:
    toc = "".join(f'<li><a href="#{s.key}">{escape(s.title)}</a> — {s.status}</li>' for s in result.sections)
    missing = sum(s.status == MISSING for s in result.sections)
    partial = sum(s.status == PARTIAL for s in result.sections)
    poor = sum(s.status == POOR_FIT for s in result.sections)
    meta = (f"store <code>{escape(str(result.db))}</code> · campaign <code>{escape(str(result.campaign))}</code> · "
            f"artifact <code>{escape(str(result.artifact))}</code> · {len(result.sections)} sections, "
            f"{poor} poor fit, {partial} partial, {missing} missing")
    body = "\n".join(section(s) for s in result.sections)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>HybridSpec report</title>'
            f"<style>{CSS}</style></head><body><h1>HybridSpec calibration report</h1>"
            f'<p class="meta">{meta}</p>{checks_summary(result)}<nav><ol>{toc}</ol></nav>\n{body}\n</body></html>\n')


def checks_summary(result: ReportResult) -> str:
    """At the top of the page: whose fit the artifact is when it is another model's, then every failed
    fit-quality check (or that all passed, or why none ran)."""
    other = f'<p class="note">{escape(result.other_model)}</p>' if result.other_model else ""
    if not result.checks:
        return other or '<p class="note">No artifact: the fit-quality checks did not run.</p>'
    return other + _checks(result)


def _checks(result: ReportResult) -> str:
    failed = result.failed_checks
    if not failed:
        unknown = sum(c.status == "unknown" for c in result.checks)
        extra = f" ({unknown} not recorded in this artifact)" if unknown else ""
        return f'<p class="checks">No fit-quality check failed: {len(result.checks)} checks{extra}.</p>'
    items = "".join(f'<li><a href="#{c.section}">{escape(c.line())}</a></li>' for c in failed)
    return f'<div class="failed"><b>{len(failed)} fit-quality check(s) failed</b><ul>{items}</ul></div>'
