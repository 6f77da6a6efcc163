"""`hybridspec report`: diagnostics a person looks at (DESIGN B.1, B.3): the store (+ artifact,
+ eval runs) → one self-contained `index.html` with a plot and the numbers behind it per section,
and a terminal summary.

Every section is always there: one whose data is missing says what is missing and which command
records it, instead of disappearing. With an artifact, the fit-quality checks of `hybridspec fit`
(`fitters/checks.py`, under the thresholds the artifact was fitted with) set each section's badge:
`ok`, or `poor fit` with the failed check first; the page's summary lists every failed check.

An artifact fitted for another model or drafter than the campaign's runs describes none of this
store's measurements: no section draws its fit and its checks do not run, each section and both
summaries naming both ids; with `force` its fit is shown, and every section that draws it is
`partial` (or `poor fit`) with a note saying whose fit it is."""

from __future__ import annotations

from pathlib import Path

from ..fitters.checks import checks_from_artifact
from .acceptance import acceptance_section, reliability_section
from .costs import cost_section, dinkelbach_section, moe_section, routing_section, stage0_section
from .html import page
from .inputs import ReportError, ReportInputs, open_inputs
from .profile import profile_section
from .result import MISSING, Figure, ReportResult, Section
from .runs import lengths_section, metadata_section, policy_section
from .terminal import summary

STORE_SECTIONS = (reliability_section, acceptance_section, cost_section, stage0_section, moe_section,
                  routing_section, dinkelbach_section, lengths_section, profile_section)
FIT_SECTIONS = ("reliability", "cost", "stage0", "moe", "routing", "dinkelbach", "policies")  # draw the artifact's fit

__all__ = ["Figure", "ReportError", "ReportResult", "Section", "build_report", "summary"]


def build_report(db: Path, out: Path, *, artifact: Path | None = None, campaign: str | None = None,
                 force: bool = False) -> ReportResult:
    """Write `out/index.html` from the store at `db` (read-only) and, when given, the artifact
    (`force`: its fit and offline estimates even when it was fitted for another model or drafter,
    each section that shows them saying so).

    `campaign`: the calibration campaign (capture's `--name`); default: the newest capture
    campaign. Raises `ReportError` for a missing store or unknown campaign, `ArtifactError` for an
    invalid artifact (both ValueError)."""
    artifact = Path(artifact) if artifact is not None else None
    inputs = open_inputs(Path(db), artifact, campaign, force)
    try:
        sections = [build(inputs) for build in STORE_SECTIONS]
        metadata = metadata_section(inputs)
    finally:
        inputs.store.close()
    # the offline estimates open the store themselves: after this report's connection is closed
    sections += [policy_section(inputs.db, artifact, inputs.campaign, inputs.eval_runs, force), metadata]
    note = other_model_note(inputs.other_model, force)
    checks = _badges(sections, inputs, forced_note=note if force else "")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = ReportResult(out / "index.html", inputs.db, inputs.campaign, artifact, sections, checks, note)
    result.path.write_text(page(result), encoding="utf-8")
    return result


def _badges(sections: list[Section], inputs: ReportInputs, forced_note: str) -> list:
    """The artifact's fit-quality checks, each failed one on its section (`poor fit`); `forced_note`
    (another model's artifact, forced) makes each section that shows its fit `partial`, saying so."""
    for section in sections:
        if forced_note and section.key in FIT_SECTIONS and section.status != MISSING:
            section.partial(forced_note)
    checks = checks_from_artifact(inputs.params, inputs.meta) if inputs.params is not None else []
    by_key = {s.key: s for s in sections}
    for check in checks:
        if check.failed and check.section in by_key:
            by_key[check.section].poor_fit([check.line()])
    return checks


def other_model_note(other_model: str, force: bool) -> str:
    """What the report does with an artifact fitted for another model or drafter (`other_model`:
    both ids); "" for the campaign's own artifact or none."""
    if not other_model:
        return ""
    if force:
        return (f"{other_model}; shown as --force asks: every fit, estimate and fit-quality check from it "
                "describes that model, not these measurements")
    return f"{other_model}: no section shows its fit, estimates or fit-quality checks (pass --force to show them anyway)"
