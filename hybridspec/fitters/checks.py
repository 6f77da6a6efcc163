"""Fit-quality checks (DESIGN A.9): is each fitted quantity fit to decide with?

The checks read only what an artifact holds (the C_tgt table, s, η and the fit diagnostics), so
`hybridspec fit` runs them before writing, and `inspect` and `report` run the same function on a
saved artifact. Each check names its number and its threshold:

    cost_positive        C_tgt(w) > 0 for every supported w (a verification never costs nothing)
    cost_monotone        Spearman rank correlation of the per-length median round latency with w
                         ≥ `cost_monotone` (longer verification is slower; drift breaks this)
    cost_r2              R² of the quadratic over the per-length medians ≥ `cost_r2`
    s_positive, s_r2     s > 0; R² of the Stage-0 line over per-u medians ≥ `s_r2`
    eta_positive, eta_r2 η > 0; R² of the MoE line over per-count medians ≥ `eta_r2`
    acceptance_log_loss  held-out log-loss of the calibrated model ≤ raw confidence's + `log_loss_margin`
                         + `log_loss_z` standard errors of the paired per-row difference (a small
                         held-out set cannot tell a few hundredths of a nat from noise; a
                         calibration that is really worse than raw confidence still fails)
    acceptance_two_classes  the capture rounds hold both accepted and rejected draft tokens (else the
                         acceptance model is a constant: fine for an artifact used only for its
                         costs, `estimate --costs`, not for deciding)
    rho_converged        Dinkelbach's iteration for ρ reached its fixed point

A check whose number the artifact does not record is `unknown`, which is not a failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np
from scipy.stats import spearmanr

OK, FAILED, UNKNOWN = "ok", "failed", "unknown"
RHO_TOLERANCE = 1e-9  # relative change of ρ in the last iteration that counts as converged


@dataclass(frozen=True)
class Thresholds:
    """The configurable limits of the checks (`hybridspec fit --threshold NAME=VALUE`)."""

    cost_r2: float = 0.8  # minimum R² of the C_tgt quadratic over per-length medians
    cost_monotone: float = 0.8  # minimum Spearman correlation of per-length median latency with w
    s_r2: float = 0.5  # minimum R² of the Stage-0 line over per-u medians
    eta_r2: float = 0.5  # minimum R² of the MoE line over per-count medians
    log_loss_margin: float = 0.0  # how much worse than raw confidence the held-out log-loss may be
    log_loss_z: float = 2.0  # … plus this many standard errors of the paired held-out difference

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not np.isfinite(value):
                raise ValueError(f"threshold {f.name}: {value!r} is not a finite number")
        for name in ("cost_r2", "s_r2", "eta_r2"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"threshold {name}: {getattr(self, name)} outside [0, 1]")
        if not -1 <= self.cost_monotone <= 1:
            raise ValueError(f"threshold cost_monotone: {self.cost_monotone} outside [-1, 1]")

    @classmethod
    def parse(cls, pairs: Sequence[str] = (), base: dict | None = None) -> "Thresholds":
        """`["cost_r2=0.7", …]` over `base` (e.g. an artifact's recorded thresholds) over the defaults."""
        values = {f.name: f.default for f in fields(cls)}
        values.update({k: float(v) for k, v in (base or {}).items() if k in values})
        for pair in pairs:
            name, sep, text = pair.partition("=")
            if not sep or name.strip() not in values:
                raise ValueError(f"--threshold {pair!r}: expected NAME=VALUE with NAME one of {', '.join(values)}")
            try:
                values[name.strip()] = float(text)
            except ValueError:
                raise ValueError(f"--threshold {pair!r}: {text!r} is not a number") from None
        return cls(**values)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    """One check: its name, the report section it belongs to, the number, the limit and the verdict."""

    name: str
    section: str  # the report section (cost, stage0, moe, reliability, dinkelbach)
    status: str  # ok, failed or unknown
    value: float | None
    limit: str  # e.g. "≥ 0.8"
    detail: str  # the quantity in words, with the number

    @property
    def failed(self) -> bool:
        return self.status == FAILED

    def line(self) -> str:
        verdict = {OK: "ok", FAILED: "FAILED", UNKNOWN: "not recorded"}[self.status]
        return f"{self.name}: {self.detail} (needs {self.limit}) — {verdict}"


def _verdict(passed: bool | None) -> str:
    return UNKNOWN if passed is None else (OK if passed else FAILED)


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _section(record: dict, name: str) -> dict:
    """`record[name]` when it is a JSON object, else {}: a section an artifact lacks or holds in another
    shape (edited by hand) leaves its checks `unknown`."""
    value = record.get(name)
    return value if isinstance(value, dict) else {}


def _cells(value) -> list[dict] | None:
    """The recorded per-length cells [{w, median, …}], or None unless each has numeric w and median."""
    if not isinstance(value, list) or not all(
            isinstance(c, dict) and _number(c.get("w")) is not None and _number(c.get("median")) is not None
            for c in value):
        return None
    return value


def _r2_check(name: str, section: str, what: str, r2, minimum: float) -> Check:
    r2 = _number(r2)
    shown = "not recorded" if r2 is None else f"{r2:.3f}"
    return Check(name, section, _verdict(None if r2 is None else r2 >= minimum), r2, f"≥ {minimum:g}",
                 f"R² of {what} {shown}")


def _positive(name: str, section: str, what: str, value: float, unit: str, scale: float) -> Check:
    return Check(name, section, _verdict(bool(np.isfinite(value) and value > 0)), float(value), "> 0",
                 f"{what} = {value * scale:.3g} {unit}")


def monotone_correlation(cells: Sequence[dict]) -> float | None:
    """Spearman correlation of the per-length median latency with w (None for < 3 lengths)."""
    if len(cells) < 3:
        return None
    w = [c["w"] for c in cells]
    median = [c["median"] for c in cells]
    if len(set(median)) < 2:
        return 0.0  # a flat curve does not grow with w
    return float(spearmanr(w, median).statistic)


def quality_checks(*, cost: Sequence[float], lengths: Sequence[int], s: float, eta: float, diagnostics: dict,
                   thresholds: Thresholds) -> list[Check]:
    """Every check of the module docstring, from an artifact's numbers (`cost[w]` in seconds)."""
    t = thresholds
    cost_diag = _section(diagnostics, "cost")
    table = np.array([cost[w] for w in lengths], dtype=float)
    lowest = int(np.argmin(table))
    checks = [Check("cost_positive", "cost", _verdict(bool(np.all(table > 0))), float(table[lowest]), "> 0",
                    f"smallest C_tgt(w) = {table[lowest] * 1e3:.3g} ms at w = {lengths[lowest]}")]
    cells = _cells(cost_diag.get("cells"))
    rank = monotone_correlation(cells) if cells else None
    shown = "not recorded" if rank is None else f"{rank:.3f}"
    checks.append(Check("cost_monotone", "cost", _verdict(None if rank is None else rank >= t.cost_monotone), rank,
                        f"≥ {t.cost_monotone:g}", f"rank correlation of the median round latency with w {shown}"))
    checks.append(_r2_check("cost_r2", "cost", "the C_tgt quadratic", cost_diag.get("r2"), t.cost_r2))
    checks.append(_positive("s_positive", "stage0", "s", s, "µs/token", 1e6))
    checks.append(_r2_check("s_r2", "stage0", "the Stage-0 line", _section(diagnostics, "s").get("r2"), t.s_r2))
    checks.append(_positive("eta_positive", "moe", "η", eta, "µs/expert", 1e6))
    checks.append(_r2_check("eta_r2", "moe", "the MoE line", _section(diagnostics, "eta").get("r2"), t.eta_r2))
    checks.append(_log_loss_check(_section(diagnostics, "acceptance"), t.log_loss_margin, t.log_loss_z))
    single = _section(diagnostics, "acceptance_model").get("single_class")
    single = single if isinstance(single, bool) else None
    checks.append(Check("acceptance_two_classes", "reliability", _verdict(None if single is None else not single),
                        None, "both outcomes", "not recorded" if single is None else
                        ("every draft token had the same outcome: a constant acceptance model" if single
                         else "accepted and rejected draft tokens both seen")))
    checks.append(_rho_check(diagnostics))
    return checks


def _log_loss_check(metrics: dict, margin: float, z: float) -> Check:
    full, raw = (_number(_section(metrics, k).get("log_loss")) for k in ("full", "raw"))
    if full is None or raw is None:
        return Check("acceptance_log_loss", "reliability", UNKNOWN, full, f"≤ raw + {margin:g}",
                     "held-out log-loss not recorded")
    se = _number(_section(metrics, "full_vs_raw").get("se"))
    detail = f"held-out log-loss of the calibrated model {full:.3f}"
    if se is None or not np.isfinite(se):  # not recorded, or one row: the plain comparison
        return Check("acceptance_log_loss", "reliability", _verdict(full <= raw + margin), full,
                     f"≤ raw confidence's {raw:.3f} + {margin:g}", detail)
    rows = _section(metrics, "full_vs_raw").get("rows")
    return Check("acceptance_log_loss", "reliability", _verdict(full <= raw + margin + z * se), full,
                 f"≤ raw confidence's {raw:.3f} + {margin:g} + {z:g} × {se:.3f} (s.e. of the difference)",
                 f"{detail}, {full - raw:+.3f} against raw confidence over {rows} held-out rows")


def _rho_check(diagnostics: dict) -> Check:
    iterations = diagnostics.get("dinkelbach")
    iterations = iterations if isinstance(iterations, list) and all(isinstance(i, dict) for i in iterations) else []
    converged = diagnostics.get("dinkelbach_converged")
    converged = converged if isinstance(converged, bool) else None
    if converged is None and iterations:  # not recorded: the last step's change of ρ says
        last = iterations[-1]
        rho, next_rho = _number(last.get("rho")), _number(last.get("next_rho"))
        converged = last.get("converged")
        if not isinstance(converged, bool):
            converged = (None if rho is None or next_rho is None
                         else abs(next_rho - rho) <= RHO_TOLERANCE * max(1.0, abs(rho)))
    if converged is None:
        return Check("rho_converged", "dinkelbach", UNKNOWN, None, "converged", "Dinkelbach iterations not recorded")
    detail = f"Dinkelbach's iteration {'converged' if converged else 'did not converge'} in {len(iterations)} steps"
    return Check("rho_converged", "dinkelbach", _verdict(bool(converged)), float(len(iterations)), "converged",
                 detail + (str(diagnostics.get("dinkelbach_note") or "") if not converged else ""))


def failed(checks: Sequence[Check]) -> list[Check]:
    return [c for c in checks if c.failed]


def checks_from_artifact(params, meta: dict, thresholds: Thresholds | None = None) -> list[Check]:
    """The checks of a loaded artifact, under `thresholds` (default: those it was fitted with)."""
    diagnostics = meta.get("diagnostics", {}) if isinstance(meta.get("diagnostics"), dict) else {}
    if thresholds is None:
        thresholds = Thresholds.parse(base=diagnostics.get("thresholds") or {})
    return quality_checks(cost=params.cost, lengths=params.lengths, s=params.s, eta=params.eta,
                          diagnostics=diagnostics, thresholds=thresholds)


def check_rows(checks: Sequence[Check]) -> list[dict]:
    """The checks as plain dicts (the artifact's `diagnostics.checks`)."""
    return [{**asdict(c), "line": c.line()} for c in checks]
