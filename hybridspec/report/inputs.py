"""What a report reads: the store (read-only), the campaign's runs by pass, the eval runs and the
artifact. Every section builder takes one `ReportInputs` and reads through it.

An artifact fitted for another model or drafter than the campaign's runs (`identity_mismatch`) is
kept out of every section's fit unless forced: `params` and `meta` stay None, and each note that
would ask for an artifact names both ids instead.

The campaign is the `--name` of `hybridspec capture`: its runs are found by (name, pass), as
`fitters/campaign.py` finds them. Without a name the campaign of the newest capture run is used."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from ..artifacts.artifact import identity_mismatch, load_artifact
from ..artifacts.params import PolicyParameters
from ..fitters.capture_rounds import held_out_prompts, read_capture_rounds
from ..workbench.store import Store, run_id_for

CALIBRATION_PASSES = ("capture", "fixed", "stage0", "moe", "routing", "profile")
IDENTITY_PASSES = ("capture", "fixed", "routing")  # `fit` checks that their runs share one model and drafter


class ReportError(ValueError):
    """A report that cannot be built (no such store, an unknown campaign); the message says which."""


@dataclass
class ReportInputs:
    db: Path
    store: Store
    campaign: str | None
    campaign_note: str  # how the campaign was chosen
    runs: dict[str, dict] = field(default_factory=dict)  # pass → runs row of the campaign
    eval_runs: list[dict] = field(default_factory=list)  # runs rows with pass = 'eval', oldest first
    artifact_path: Path | None = None
    params: PolicyParameters | None = None  # the fit the sections draw, and its metadata: None without an
    meta: dict | None = None  # artifact, or when it is another model's and not forced
    artifact_meta: dict | None = None  # the artifact's metadata as read, whichever model it was fitted for
    other_model: str = ""  # the artifact was fitted for another model or drafter: a sentence naming both ids
    cache: dict = field(default_factory=dict)  # what several sections read (capture_rounds)

    def run_id(self, pass_name: str) -> str | None:
        row = self.runs.get(pass_name)
        return row["run_id"] if row else None

    def has_table(self, table: str) -> bool:
        return bool(self.store.query("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                     [table])[0][0])

    def frame(self, sql: str, args: list | None = None) -> pl.DataFrame:
        return self.store.frame(sql, args)

    def missing_pass(self, pass_name: str) -> str:
        """The note of a section whose pass is absent, with the command that records it."""
        where = (f"campaign {self.campaign!r} of {self.db}" if self.campaign is not None
                 else f"{self.db}, which holds no calibration campaign")
        return (f"no {pass_name} run in {where}: run "
                f"`hybridspec capture --db {self.db} --name {name_arg(self.campaign)} --passes {pass_name}`")

    def missing_artifact(self, what: str) -> str:
        if self.other_model:
            return f"{what} not shown: {self.other_model} (pass --force to show it anyway)"
        return (f"no artifact given: {what} needs one (`hybridspec fit --db {self.db} --name "
                f"{name_arg(self.campaign)} --out A`, then report with --artifact A)")


def name_arg(campaign: str | None) -> str:
    """The `--name` of a suggested command line: the campaign, or NAME for a store without one."""
    return campaign if campaign is not None else "NAME"


def describe_campaign(campaign: str | None) -> str:
    """`campaign 'c'`, or what a store without a calibration campaign has instead."""
    return f"campaign {campaign!r}" if campaign is not None else "a calibration campaign (the store holds none)"


def open_inputs(db: Path, artifact: Path | None, campaign: str | None, force: bool = False) -> ReportInputs:
    """Open the store read-only, resolve the campaign and load (and validate) the artifact (`force`:
    its fit even when it was fitted for another model or drafter)."""
    db = Path(db)
    if not db.is_file():
        raise ReportError(f"--db {db}: no such store")
    store = Store(db, read_only=True)
    try:
        store.verify()  # a damaged file: one StoreError naming it, before any section is built
        campaign, note = _resolve_campaign(store, campaign)
        runs = {}
        for pass_name in CALIBRATION_PASSES:
            row = store.run_row(run_id_for(campaign, pass_name)) if campaign else None
            if row is not None:
                runs[pass_name] = row
        eval_runs = [store.run_row(run_id) for (run_id,) in
                     store.query("SELECT run_id FROM runs WHERE pass = 'eval' ORDER BY started_at")]
        params, meta = load_artifact(artifact) if artifact is not None else (None, None)
    except BaseException:
        store.close()
        raise
    inputs = ReportInputs(db, store, campaign, note, runs, eval_runs, artifact, params, meta, artifact_meta=meta,
                          other_model=other_model(meta, runs, artifact))
    if inputs.other_model and not force:  # another model's fit: no section draws or judges it
        inputs.params = inputs.meta = None
    return inputs


def other_model(meta: dict | None, runs: dict[str, dict], artifact: Path | None) -> str:
    """A sentence naming both ids when the artifact was fitted for another model or drafter than
    the campaign's runs (`identity_mismatch`); "" when it was not, or without an artifact or such a
    run."""
    run = next((runs[p] for p in IDENTITY_PASSES if p in runs), None)
    if meta is None or run is None:
        return ""
    return identity_mismatch(meta, model_id=run["model_id"], drafter_id=run["drafter_id"] or "", source=str(artifact))


def _resolve_campaign(store: Store, campaign: str | None) -> tuple[str | None, str]:
    passes = ", ".join(f"'{p}'" for p in CALIBRATION_PASSES)
    names = [n for (n,) in store.query(f"SELECT name FROM runs WHERE pass IN ({passes}) "
                                       "GROUP BY name ORDER BY max(pass = 'capture') DESC, max(started_at) DESC")]
    if campaign is not None:
        if campaign not in names:
            known = ", ".join(repr(n) for n in names) or "none"
            raise ReportError(f"{store.path}: no calibration run named {campaign!r} (campaigns: {known})")
        return campaign, f"campaign {campaign!r} (as asked)"
    if not names:
        return None, "no calibration runs in the store"
    others = f"; others: {', '.join(repr(n) for n in names[1:])} (choose with --name)" if names[1:] else ""
    return names[0], f"campaign {names[0]!r} (the newest capture campaign{others})"


@dataclass
class CaptureRounds:
    """The capture rounds every acceptance fit uses: untruncated, fully verified (A_D known)."""

    prompt_id: np.ndarray  # [N]
    category: np.ndarray  # [N]
    accepted_full: np.ndarray  # [N] A_D
    confidence: np.ndarray  # [N, D] conf_i
    entropy: np.ndarray  # [N, D] h_i

    @property
    def draft_len(self) -> int:
        return self.confidence.shape[1]

    def held_out(self) -> tuple[np.ndarray, str]:
        """(mask [N], description): the fit's held-out rounds, every fifth prompt; all rounds if none."""
        prompts = set(self.prompt_id.tolist())
        held = held_out_prompts(prompts)
        mask = np.isin(self.prompt_id, list(held))
        if mask.any():
            return mask, (f"held-out rounds: {len(held)} of {len(prompts)} prompts (every fifth by id, "
                          "as `hybridspec fit` held them out)")
        return ~mask, f"training rounds: {len(prompts)} prompts are too few for the fit to hold any out"


def capture_rounds(inputs: ReportInputs) -> CaptureRounds | None:
    """The capture run's usable rounds with their draft positions (None without a capture run or
    without such rounds); read once per report."""
    if "capture" not in inputs.cache:
        inputs.cache["capture"] = _read_capture_rounds(inputs)
    return inputs.cache["capture"]


def _read_capture_rounds(inputs: ReportInputs) -> CaptureRounds | None:
    run_id = inputs.run_id("capture")
    if run_id is None:
        return None
    rounds = read_capture_rounds(inputs.store, run_id)
    if not len(rounds.accepted_full) or rounds.draft_len == 0:
        return None
    conf, ent = (np.nan_to_num(x, nan=0.0) for x in (rounds.confidence, rounds.entropy))  # 0: not recorded
    return CaptureRounds(rounds.prompt_id, rounds.category, rounds.accepted_full, conf, ent)
