"""`hybridspec eval` (DESIGN A.10): the prompts of a split decoded by each length policy through the
real runtime, every request and round recorded in the store (pass `eval`); the paper's Table 1
(pooled TPS, SR, AL, mean w per category) computed from those rows, beside the offline estimates
(`evaluation/offline.py`) of the same campaign's capture run when the store has one.

One unit per (policy, prompt): prompts in file order and, within a prompt, `ar` first, so a prompt's
`ar` output is committed before any other policy's and every greedy output is compared with it
(the first differing position is stored, never hidden), also across `--resume`. `ar` is always run:
SR and the exactness check are relative to it. Interleaving the policies per prompt spreads slow
drift of the machine over every policy alike; each policy gets one unrecorded warm-up generation
per process (first-call costs).

Order of checks, all before a model is loaded: options → model identities → artifact (needed,
validated, fitted for this pair: `resolve_policy`) → policy names and lengths → store path writable
→ prompt file (its split, categories, token ids) → an existing store read whole, read-only (schema,
damage) → run name free (or --resume / --overwrite) → `static:best` chosen on the campaign's capture
run. Then the models are loaded, and only then is the store created or opened for writing, so a
refused invocation leaves no store behind and an existing one as it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import polars as pl
import torch

from ..artifacts.artifact import ArtifactError
from ..artifacts.params import PolicyParameters
from ..evaluation.offline import (AVERAGE, OfflineError, best_static_length, compare_with_measured,
                                  estimate_from_store, in_policy_order, missing_categories, restrict_categories,
                                  table_categories)
from ..evaluation.tables import EVAL_PASS, measured_from_store
from ..runtime.config import drafter_config_from_dict, read_config_json
from ..runtime.loading import RANDOM_BLOCK_SIZE, target_config
from ..runtime.policies import NEEDS_PARAMETERS, PolicyError, make_policy, resolve_policy
from ..runtime.sampling import SamplingParams
from ..runtime.session import check_context, open_session, resolve_backend
from ..workbench.runinfo import cpu_model, file_digest, gpu_model, set_threads, software_versions
from ..workbench.store import RunSpec, Store, check_writable, run_id_for
from .campaign import (MAX_BLOCK, REMEDY, NullReporter, PassSummary, Reporter, load_run_prompts, resolve_models,
                       run_pass, tokenized_prompts)
from .common import CaptureConfigError, OutputLimit, PassContext, PromptIds, Unit, check_run_options, microseconds

PASS = EVAL_PASS
DEFAULT_STATIC = 7  # the paper's static-length ablation (A.10); the artifact holds no static-length sweep
ESTIMATES_UNIT = "offline-estimates"
WARMUP_TOKENS = 8


class EvalConfigError(CaptureConfigError):
    """An eval option that cannot be used; the message names the option."""


@dataclass(frozen=True)
class EvalConfig(OutputLimit):
    """One `hybridspec eval` invocation. Fields named as in `CaptureConfig` mean the same, so the
    capture driver (`PassContext`, `resolve_models`, `run_pass`) runs the eval pass unchanged."""

    quick_new_tokens: ClassVar[int] = 32

    model: str | None = None  # None: the embedded default pair
    drafter: str | None = None
    artifact: Path | None = None
    prompts: Path | None = None  # None: the embedded prompt set
    split: str = "test"
    policies: tuple[str, ...] | None = None  # None: ar, full, static:7 and, with an artifact, the calibrated ones
    db: Path = Path("capture.duckdb")
    name: str = "default"  # the campaign: capture, fit and eval of one name line up
    max_new_tokens: int | None = None  # None: 128, or 32 with quick
    temperature: float = 0.0
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "auto"
    graphs: bool = True  # False: the resident round without CUDA graphs (--no-graphs)
    quick: bool = False
    resume: bool = False
    overwrite: bool = False
    force: bool = False  # use an artifact fitted for another model/drafter
    seed: int = 0
    threads: int | None = None  # torch CPU threads; None: 1 on a CPU device
    categories: tuple[str, ...] | None = None  # None: every category of the split

    def __post_init__(self):
        check_run_options(self, EvalConfigError)
        if not self.temperature >= 0:
            raise EvalConfigError(f"--temperature {self.temperature}: must be ≥ 0")
        if self.policies is not None and not self.policies:
            raise EvalConfigError("--policies is empty")


def parse_policies(text: str | None) -> tuple[str, ...] | None:
    """`ar,full,static:4` → names in the given order, duplicates dropped (None stays None)."""
    if text is None:
        return None
    return tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))


BEST_STATIC = "static:best"


def resolve_policies(requested: tuple[str, ...] | None, draft_len: int, params: PolicyParameters | None
                     ) -> tuple[str, ...]:
    """The policies to run, `ar` first; every name checked by the runtime's own `make_policy`
    (`static:best` is replaced by a length before this, `choose_best_static`)."""
    if requested is None:
        requested = ("full", f"static:{min(DEFAULT_STATIC, draft_len + 1)}", *(NEEDS_PARAMETERS if params else ()))
    for name in requested:
        try:
            make_policy(name, draft_len, params)
        except PolicyError as exc:
            raise EvalConfigError(f"--policies: {exc}") from None
    return ("ar", *(p for p in requested if p != "ar"))


def check_best_static(requested: tuple[str, ...] | None, params: PolicyParameters | None) -> None:
    if requested is not None and BEST_STATIC in requested and params is None:
        raise EvalConfigError(f"--policies {BEST_STATIC}: needs --artifact (the length is chosen by the offline "
                              "estimate of the campaign's capture run)")


def choose_best_static(requested: tuple[str, ...] | None, store: Store, params: PolicyParameters | None,
                       meta: dict | None, config: "EvalConfig") -> tuple[tuple[str, ...] | None, str | None]:
    """`static:best` in the requested policies → `static:k`, k the static length the offline
    estimate ranks first on the campaign's capture run (its calibration prompts; the paper's
    "best static length chosen on calibration prompts"). Returns the policies and a note."""
    if requested is None or BEST_STATIC not in requested:
        return requested, None
    check_best_static(requested, params)
    try:
        k, table = best_static_length(store, params, meta, campaign=config.name, source=str(config.artifact),
                                      force=config.force)
    except OfflineError as exc:
        raise EvalConfigError(f"--policies {BEST_STATIC}: {exc}") from None
    tps = table.filter((pl.col("policy") == f"static:{k}") & (pl.col("category") == AVERAGE))["tps"][0]
    chosen = tuple(dict.fromkeys(f"static:{k}" if name == BEST_STATIC else name for name in requested))
    return chosen, (f"{BEST_STATIC} = static:{k}: the highest estimated TPS ({tps:.1f}) over the capture run "
                    f"of campaign {config.name!r} (calibration prompts)")


def draft_length(drafter: str | None) -> int:
    """D of a drafter directory from its config.json (no weights read), or of a random drafter."""
    if drafter in (None, "random"):
        return RANDOM_BLOCK_SIZE - 1
    return drafter_config_from_dict(read_config_json(Path(drafter)), str(drafter)).draft_len


def first_mismatch(tokens: list[int], reference: list[int]) -> int | None:
    """First index where the outputs differ (a shorter output differs where it ends); None if equal."""
    for i, (a, b) in enumerate(zip(tokens, reference)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


class EvalPass:
    """The eval pass for `run_pass`: one unit per (policy, prompt), `ar` first within each prompt."""

    name = PASS

    def __init__(self, store: Store, policies: tuple[str, ...], params: PolicyParameters | None, meta: dict | None,
                 sampling: SamplingParams, draft_len: int):
        self.store, self.names, self.parameters, self.meta = store, policies, params, meta
        self.sampling, self.draft_len = sampling, draft_len

    def params(self, ctx: PassContext) -> dict:
        return {**ctx.timed_params(), "policies": list(self.names), "max_new_tokens": ctx.config.new_tokens,
                "artifact": self.meta["content_sha256"] if self.meta else None,
                "temperature": self.sampling.temperature, "sampling_seed": self.sampling.seed,
                "draft_len": self.draft_len, "warmup_generations_per_policy": 1}

    def units(self, ctx: PassContext) -> list[Unit]:
        return [Unit(f"policy={name}:prompt:{p.id}", (name, p)) for p in ctx.prompts for name in self.names]

    def prepare(self, ctx: PassContext) -> None:
        self.policies = {n: make_policy(n, self.draft_len, self.parameters, device=ctx.config.device)
                         for n in self.names}
        self.reference = {p: json.loads(ids) for p, ids in self.store.query(  # ar outputs of earlier processes
            "SELECT prompt_id, token_ids FROM eval_requests WHERE run_id = ? AND policy = 'ar'", [ctx.run_id])}
        for policy in self.policies.values():
            self._generate(ctx, policy, ctx.prompts[0], min(WARMUP_TOKENS, ctx.config.new_tokens))

    def _generate(self, ctx: PassContext, policy, prompt: PromptIds, new_tokens: int):
        return ctx.session.engine.generate(list(prompt.ids), policy=policy, max_new_tokens=new_tokens,
                                           sampling=self.sampling, eos_ids=ctx.session.eos_ids)

    def collect(self, ctx: PassContext, item: tuple[str, PromptIds]) -> dict[str, list[dict]]:
        name, prompt = item
        result = self._generate(ctx, self.policies[name], prompt, ctx.config.new_tokens)
        if name == "ar":
            self.reference[prompt.id] = result.token_ids
        compare = self.sampling.greedy and name != "ar"
        key = {"run_id": ctx.run_id, "policy": name, "prompt_id": prompt.id}
        request = {**key, "category": prompt.category, "prompt_tokens": len(prompt.ids),
                   "emitted_tokens": result.decode_tokens, "rounds": len(result.rounds),
                   "decode_seconds": result.decode_seconds, "mean_w": result.mean_verification_length,
                   "mismatch_position": (first_mismatch(result.token_ids, self.reference[prompt.id]) if compare
                                         else None),
                   "finish_reason": result.finish_reason, "token_ids": json.dumps(result.token_ids)}
        rounds = [{**key, "round_idx": i, "w0": r.w0, "u": r.u, "w": r.w, "accepted": r.accepted,
                   "emitted": r.emitted, "truncated": r.truncated, "latency_us": microseconds(r.seconds["total"])}
                  for i, r in enumerate(result.rounds)]
        return {"eval_requests": [request], "eval_rounds": rounds}


@dataclass
class EvalResult:
    run_id: str
    summary: PassSummary
    policies: tuple[str, ...]
    greedy: bool  # outputs were compared with ar
    prompts: int  # decoded prompts (requests per policy)
    measured: pl.DataFrame  # offline.MEASURED_COLUMNS, from eval_requests
    mismatches: pl.DataFrame  # policy, prompt_id, mismatch_position of every output that differs from ar's
    estimates: pl.DataFrame | None = None  # from offline_estimates, the eval's policies and categories
    comparison: pl.DataFrame | None = None  # offline.compare_with_measured
    notes: list[str] = field(default_factory=list)


def run_eval(config: EvalConfig, reporter: Reporter | None = None) -> EvalResult:
    """Decode, record and summarise (module docstring)."""
    models = resolve_models(config)
    try:
        params, meta = resolve_policy(config.policies or (), config.artifact, models, config.force)
    except PolicyError as exc:
        raise EvalConfigError(f"--policies: {exc}") from None
    draft_len = params.draft_len if params is not None else draft_length(models.drafter)
    check_best_static(config.policies, params)
    if config.policies is not None:  # every other name checked before the store is touched
        resolve_policies(tuple(p for p in config.policies if p != BEST_STATIC), draft_len, params)
    check_writable(config.db)
    prompt_file, prompts = load_run_prompts(config, EvalConfigError)
    ids = tokenized_prompts(prompts, models, prompt_file)
    backend = resolve_backend(config.backend, config.device)  # stored with the run
    requested, best_note = _check_store(config, params, meta)
    policies = resolve_policies(requested, draft_len, params)
    threads = set_threads(config.threads, config.device)
    context = max(len(p.ids) for p in ids) + config.new_tokens + 2 * MAX_BLOCK
    check_context(target_config(models.model), context, REMEDY)
    session = open_session(models.model, models.drafter, need_drafter=len(policies) > 1, device=config.device,
                           dtype=config.dtype, backend=backend, seed=config.seed, graphs=config.graphs,
                           max_context=context)
    with Store(config.db) as store:
        ctx = PassContext(config, session, ids, file_digest(prompt_file))
        collector = EvalPass(store, policies, params, meta, SamplingParams(config.temperature, seed=config.seed),
                             draft_len)
        spec = RunSpec(name=config.name, pass_name=PASS, model_id=models.model_id, drafter_id=models.drafter_id,
                       device=config.device, dtype=config.dtype, backend=backend, params=collector.params(ctx),
                       versions=software_versions(), model=models.model, drafter=models.drafter, threads=threads,
                       host_cpu=cpu_model(), host_gpu=gpu_model(config.device))
        with torch.no_grad():
            summary = run_pass(store, ctx, collector, spec, 0, reporter or NullReporter())
        result = EvalResult(summary.run_id, summary, policies, config.temperature == 0, len(ids),
                            measured_from_store(store, summary.run_id, list(policies)),
                            store.frame("SELECT policy, prompt_id, mismatch_position FROM eval_requests WHERE "
                                        "run_id = ? AND mismatch_position IS NOT NULL ORDER BY policy, prompt_id",
                                        [summary.run_id]))
        if best_note:
            result.notes.append(best_note)
        _attach_estimates(store, result, params, meta, config)
    return result


def _check_store(config: EvalConfig, params: PolicyParameters | None, meta: dict | None
                 ) -> tuple[tuple[str, ...] | None, str | None]:
    """The checks that read the store, an existing one opened read-only: intact (read whole), the run
    name free, `static:best` resolved (`choose_best_static`: the policies and a note)."""
    db = Path(config.db)
    if not db.is_file():
        if config.policies is not None and BEST_STATIC in config.policies:
            raise EvalConfigError(f"--policies {BEST_STATIC}: {db}: campaign {config.name!r} has no capture run "
                                  "(no such store)")
        return config.policies, None
    with Store(db, read_only=True) as store:
        store.verify()
        store.check_name_free(config.name, PASS, 0, resume=config.resume, overwrite=config.overwrite)
        return choose_best_static(config.policies, store, params, meta, config)


def _attach_estimates(store: Store, result: EvalResult, params, meta, config: EvalConfig) -> None:
    """Offline estimates of the campaign's capture run over the evaluated categories (so that each
    Average row means the same categories as the measured one), committed once as a unit of the
    eval run."""
    if params is None:
        result.notes.append("no --artifact: no offline estimates")
        return
    evaluated = table_categories(result.measured)
    if ESTIMATES_UNIT not in store.done_units(result.run_id):
        try:
            estimates = estimate_from_store(store, params, meta, campaign=config.name, categories=evaluated,
                                            source=str(config.artifact), force=config.force)
        except (OfflineError, ArtifactError) as exc:
            result.notes.append(f"no offline estimates: {exc}")
            return
        capture = run_id_for(config.name, "capture")
        rows = [{"run_id": result.run_id, "capture_run_id": capture, **row} for row in estimates.iter_rows(named=True)]
        store.commit_unit(result.run_id, ESTIMATES_UNIT, {"offline_estimates": rows})
    stored = store.frame("SELECT policy, category, rounds, emitted, al, mean_w, est_seconds, tps, sr "
                         "FROM offline_estimates WHERE run_id = ?", [result.run_id])
    stored = stored.filter(pl.col("policy").is_in(list(result.policies)))
    # the evaluated categories only, whichever the stored rows cover; Average rows over those
    estimates = restrict_categories(stored, evaluated)
    if estimates.is_empty():
        result.notes.append(f"no offline estimates: the stored ones hold none of the evaluated categories "
                            f"({', '.join(evaluated)})")
        return
    result.estimates = in_policy_order(estimates, result.policies)
    result.comparison = compare_with_measured(result.estimates, result.measured)
    missing = missing_categories(result.estimates, result.measured)
    if missing:
        result.notes.append(f"offline estimates: the capture run of campaign {config.name!r} has no rounds of "
                            f"{', '.join(missing)}; estimate − measured averages over "
                            f"{', '.join(table_categories(result.comparison))}")
