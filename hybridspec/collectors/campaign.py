"""A calibration campaign: the selected passes, run through the real runtime, into one store.

Order of checks (every cheap error before any model is loaded, and every error that needs no store
before the store is created or opened, so that a refused invocation leaves no store behind and an
existing one as it was): options → prompt file (its split, categories) → model and drafter configs
and identity hashes → prompt token ids → store path writable → store schema and damage → run names
free (or --resume / --overwrite) → model load (a store this invocation created is removed again when
the load is refused) → per pass: run identity (a resumed run must match model, drafter, device,
params and, for timed passes, threads and GPU: `store.identity_keys`).
"""

from __future__ import annotations

import json
import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from ..runtime.presets import PRESETS, preset_config
from ..runtime.loading import drafter_config, target_config
from ..runtime.session import EMBEDDED, check_context, model_identity, open_session, resolve_backend, resolve_pair
from ..runtime.tensor_parallel import rank
from ..runtime.tokenizer import load_codec
from ..workbench.prompts import Prompt, load_prompts, select_categories
from ..workbench.runinfo import cpu_model, file_digest, gpu_model, set_threads, software_versions
from ..workbench.store import RunSpec, Store
from .capture import CapturePass
from .common import (QUICK_PROMPTS_PER_CATEGORY, CaptureConfig, CaptureConfigError, CollectorPass, PassContext,
                     PromptIds)
from .fixed import FixedPass, subset_per_category
from .moe import MoePass
from .parallel import campaign_store, run_data_parallel, run_tensor_parallel
from .profile import ProfilePass
from .routing import RoutingPass
from .stage0 import Stage0Pass

PASSES: dict[str, type] = {"capture": CapturePass, "fixed": FixedPass, "stage0": Stage0Pass, "moe": MoePass,
                           "routing": RoutingPass, "profile": ProfilePass}
MAX_BLOCK = 64  # context headroom for the drafter block (generate_fully_verified runs N + W tokens)
REMEDY = f"lower --max-new-tokens (the context is the longest prompt, --max-new-tokens and {2 * MAX_BLOCK} more)"


class Reporter(Protocol):
    """Progress callbacks (the CLI draws rich progress bars from them)."""

    def pass_started(self, name: str, units: int, already_done: int) -> None: ...
    def unit_started(self, name: str, unit: str) -> None: ...
    def unit_committed(self, name: str, unit: str, rows: int) -> None: ...
    def pass_finished(self, summary: "PassSummary") -> None: ...


class NullReporter:
    def pass_started(self, name, units, already_done): pass
    def unit_started(self, name, unit): pass
    def unit_committed(self, name, unit, rows): pass
    def pass_finished(self, summary): pass


@dataclass
class PassSummary:
    name: str
    run_id: str
    status: str  # of the run after this process (finished once every shard is)
    units: int  # in this shard
    resumed: int  # units already committed before this process
    committed: int  # units committed by this process
    rows: dict[str, int] = field(default_factory=dict)  # rows of the run per table (this store)
    seconds: float = 0.0


@dataclass(frozen=True)
class ModelIdentity:
    model: str  # resolved --model (the embedded directory when none was given)
    drafter: str | None
    model_id: str
    drafter_id: str | None


def resolve_models(config: CaptureConfig) -> ModelIdentity:
    """Content identities of the target and drafter, without loading either (DESIGN B.7)."""
    model, drafter = resolve_pair(config.model, config.drafter)
    if not Path(model).is_dir() and model not in PRESETS:
        raise CaptureConfigError(f"--model {model!r} is neither a model directory nor a preset "
                                 f"({', '.join(sorted(PRESETS))})")
    if drafter is None and model not in PRESETS:
        raise CaptureConfigError(f"--drafter is required for --model {model} (a DFlash directory, or random)")
    if drafter not in (None, "random") and not Path(drafter).is_dir():
        raise CaptureConfigError(f"--drafter {drafter!r}: not a directory (a DFlash checkpoint) nor `random`")
    target_config(model)  # ConfigError naming the directory (no config.json, unusable) before it is hashed
    if drafter not in (None, "random"):
        drafter_config(drafter)
    model_id, drafter_id = model_identity(model, drafter, seed=config.seed)  # the ids artifacts are checked against
    return ModelIdentity(model, drafter or "random", model_id, drafter_id)


def prompt_ids(prompts: list[Prompt], codec, vocab: int, where: Path) -> list[PromptIds]:
    """Token ids of each prompt (text through the model's tokenizer); errors name the file, line and prompt."""
    out = []
    for p in prompts:
        at = f"{where}:{p.line}" if p.line else str(where)
        if p.ids is not None:
            ids = p.ids
        elif codec is None:
            raise CaptureConfigError(f"{at}: prompt {p.id!r} is text, but the model has no tokenizer.json; "
                                     "give prompt_ids")
        else:
            ids = tuple(codec.encode(p.text))
        if not ids:
            raise CaptureConfigError(f"{at}: prompt {p.id!r} encodes to no tokens")
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise CaptureConfigError(f"{at}: prompt {p.id!r} has ids {bad[:5]} outside the vocabulary ({vocab})")
        out.append(PromptIds(p.id, p.category, p.split, tuple(ids)))
    return out


def read_vocab_size(model: str) -> int:
    """The target's vocabulary size from its config (no weights read)."""
    config = preset_config(model) if model in PRESETS else json.loads((Path(model) / "config.json").read_text())
    return int(config.get("text_config", config)["vocab_size"])


def load_run_prompts(config, error: type[ValueError]) -> tuple[Path, list[Prompt]]:
    """The prompt file of a capture or eval (`config.prompts`, else the embedded set) and its prompts of
    `config.split` and `config.categories`, with --quick the first QUICK_PROMPTS_PER_CATEGORY of each
    category, in file order; errors name the file (and line)."""
    prompt_file = Path(config.prompts) if config.prompts is not None else EMBEDDED / "prompts.jsonl"
    prompts = load_prompts(prompt_file, split=config.split)  # file:line errors
    if not prompts:
        raise error(f"{prompt_file}: no prompts of split {config.split!r}")
    prompts = select_categories(prompts, config.categories, f"split {config.split!r} of {prompt_file}")
    if config.quick:
        prompts = subset_per_category(prompts, QUICK_PROMPTS_PER_CATEGORY)
    return prompt_file, prompts


def tokenized_prompts(prompts: list[Prompt], models: ModelIdentity, prompt_file: Path) -> list[PromptIds]:
    """`prompt_ids` with the target's tokenizer and vocabulary (read from its directory, no weights)."""
    codec = load_codec(Path(models.model)) if Path(models.model).is_dir() else None
    return prompt_ids(prompts, codec, read_vocab_size(models.model), prompt_file)


class CaptureInterrupted(KeyboardInterrupt):
    """Ctrl-C (SIGINT) during a campaign. Every unit committed before it stays in the store (a unit
    is one transaction) and the one in progress is rolled back; `message(argv)` says so in one line,
    with the command that continues the campaign."""

    def __init__(self, config: CaptureConfig, reached: tuple[str, ...] | None):
        super().__init__(str(config.db))
        self.config = config
        self.reached = reached  # passes this process started (None: its worker processes did)

    def message(self, argv: list[str]) -> str:
        """The line for the terminal; `argv`: the command's arguments after the program name."""
        if self.config.overwrite and self.reached is None:
            return ("capture interrupted: a replacement (--overwrite) run in several processes is started again, "
                    f"not continued (they do not report the passes they reached): {shlex.join(['hybridspec', *argv])}")
        return (f"capture interrupted: the units committed so far are kept in {committed_where(self.config)}; "
                f"continue with: {self.continuation(argv)}")

    def continuation(self, argv: list[str]) -> str:
        """The command(s) that finish the campaign without losing what was committed: --resume in place
        of --overwrite; with --overwrite, the passes not reached still hold their earlier runs, which
        --resume would keep, so they get a second command that replaces them."""
        resume = resume_command(argv)
        if not self.config.overwrite:
            return resume
        rest = [p for p in self.config.passes if p not in self.reached]
        if not rest:
            return resume
        replace = shlex.join(["hybridspec", *with_passes(argv, rest)])
        if not self.reached:
            return replace
        return f"{resume_command(with_passes(argv, self.reached))}, then {replace}"


def resume_command(argv: list[str]) -> str:
    """`hybridspec ARGV` as one shell line that continues the campaign: --overwrite (which would
    discard the committed units) dropped and --resume added."""
    kept = [a for a in argv if a != "--overwrite"]
    return shlex.join(["hybridspec", *kept, *([] if "--resume" in kept else ["--resume"])])


def with_passes(argv: list[str], passes) -> list[str]:
    """`argv` with its --passes value (`--passes X` or `--passes=X`; appended when absent) set to `passes`."""
    value = ",".join(passes)
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--passes" and i + 1 < len(argv):
            i += 2
        elif argv[i].startswith("--passes="):
            i += 1
        else:
            out.append(argv[i])
            i += 1
    return [*out, "--passes", value]


def committed_where(config: CaptureConfig) -> str:
    """Where an interrupted campaign's committed units are: `--db`, or under --nproc N the shard
    stores beside it (merged into `--db` only once every shard has finished)."""
    if config.nproc > 1:
        from .parallel import shard_store

        return f"the shard stores {shard_store(config.db, 0, config.nproc).name} … beside {config.db}"
    return str(config.db)


class _NotingReporter:
    """A reporter that also notes each pass started (its run opened: replaced, with --overwrite)."""

    def __init__(self, reporter: Reporter, reached: list[str]):
        self.reporter, self.reached = reporter, reached

    def pass_started(self, name, units, already_done):
        self.reached.append(name)
        self.reporter.pass_started(name, units, already_done)

    def __getattr__(self, name: str):
        return getattr(self.reporter, name)


def run_campaign(config: CaptureConfig, reporter: Reporter | None = None) -> list[PassSummary]:
    """Run `config.passes` into `config.db`; one summary per pass (`--nproc` and `--tp` run it over
    several processes: `parallel.py`; None on torchrun's ranks other than 0). Ctrl-C raises
    `CaptureInterrupted` (a KeyboardInterrupt) once the unit in progress is rolled back."""
    reached: list[str] = []
    try:
        return _run_campaign(config, _NotingReporter(reporter or NullReporter(), reached))
    except CaptureInterrupted:
        raise
    except KeyboardInterrupt:
        in_process = config.nproc == 1 and (config.tp == 1 or dist.is_initialized())
        raise CaptureInterrupted(config, tuple(reached) if in_process else None) from None


def _run_campaign(config: CaptureConfig, reporter: Reporter) -> list[PassSummary]:
    """`run_campaign` itself, in the order of checks of the module's docstring."""
    prompt_file, prompts = load_run_prompts(config, CaptureConfigError)  # before any store is touched
    models = resolve_models(config)
    ids = tokenized_prompts(prompts, models, prompt_file)
    context = max(len(p.ids) for p in ids) + config.new_tokens + 2 * MAX_BLOCK  # the longest request, and drafts
    check_context(target_config(models.model), context, REMEDY)  # before any store is created
    backend = resolve_backend(config.backend, config.device)
    if config.nproc > 1:
        return run_data_parallel(config)
    if config.tp > 1 and not dist.is_initialized():
        return run_tensor_parallel(config)
    shard_index, shard_count = config.shard
    threads = set_threads(config.threads, config.device)
    existed = Path(config.db).exists()
    with campaign_store(config) as store, _removed_if_unused(config.db, store, existed):
        store.check_names_free(config.name, config.passes, shard_index, resume=config.resume,
                               overwrite=config.overwrite)
        session = open_session(models.model, models.drafter, device=config.device, dtype=config.dtype,
                               backend=backend, seed=config.seed, graphs=config.graphs, tensor_parallel=config.tp > 1,
                               expert_parallel=config.expert_parallel, max_context=context)
        ctx = PassContext(config, session, ids, file_digest(prompt_file))
        host = dict(versions=software_versions(), threads=threads, host_cpu=cpu_model(),
                    host_gpu=gpu_model(config.device))
        summaries = []
        with torch.no_grad():
            for name in config.passes:
                collector = PASSES[name]()
                spec = RunSpec(name=config.name, pass_name=name, model_id=models.model_id,
                               drafter_id=models.drafter_id, device=config.device, dtype=config.dtype,
                               backend=backend, params=run_params(collector, ctx), model=models.model,
                               drafter=models.drafter, shard_count=shard_count, **host)
                summary = run_pass(store, ctx, collector, spec, shard_index, reporter)
                reporter.pass_finished(summary)
                summaries.append(summary)
        return summaries


@contextmanager
def _removed_if_unused(db: Path, store, existed: bool):
    """Around the use of `store`, opened by this process: when the block fails before any run row is
    written (the model or drafter refused while loading: a pair that does not fit, too little
    memory), a store file that did not exist before (`existed`) is removed again, so that the refused
    invocation leaves none behind; a store that existed, or holds a run, stays as it is."""
    try:
        yield
    except BaseException:
        if not existed and rank() == 0 and _holds_no_run(store):
            store.close()
            for leftover in (Path(db), Path(f"{db}.wal")):
                leftover.unlink(missing_ok=True)
        raise


def _holds_no_run(store) -> bool:
    """Whether the store holds no run row; False where it cannot be read (kept, and the failure that
    led here is the one reported)."""
    try:
        return store.counts()["runs"] == 0
    except Exception:  # noqa: BLE001 - any read failure means: keep the file
        return False


def run_params(collector: CollectorPass, ctx: PassContext) -> dict:
    """A run's parameters: the pass's, and the tensor-parallel world size and expert layout when
    there is one (costs measured on another layout are another run)."""
    tp, layout = ctx.config.tp, {}
    if tp > 1:
        layout = {"tensor_parallel": tp, **({"expert_parallel": True} if ctx.config.expert_parallel else {})}
    return {**collector.params(ctx), **layout}


def run_pass(store: Store, ctx: PassContext, collector: CollectorPass, spec: RunSpec, shard_index: int,
             reporter: Reporter) -> PassSummary:
    """One pass: every unit of this shard not yet committed, each in its own transaction."""
    start = time.perf_counter()
    config = ctx.config
    ctx.run_id = store.start_run(spec, shard_index, resume=config.resume, overwrite=config.overwrite)
    units = collector.units(ctx)[shard_index :: spec.shard_count]
    done = store.done_units(ctx.run_id)
    todo = [u for u in units if u.key not in done]
    reporter.pass_started(spec.pass_name, len(units), len(units) - len(todo))
    if todo:
        collector.prepare(ctx)
    for unit in todo:
        reporter.unit_started(spec.pass_name, unit.key)
        rows = store.commit_unit(ctx.run_id, unit.key, collector.collect(ctx, unit.item), shard_index)
        reporter.unit_committed(spec.pass_name, unit.key, rows)
    store.finish_shard(ctx.run_id, shard_index)
    counts = {t: n for t, n in store.counts(ctx.run_id).items() if n and t not in ("runs", "units")}
    return PassSummary(spec.pass_name, ctx.run_id, store.run_row(ctx.run_id)["status"], len(units),
                       len(units) - len(todo), len(todo), counts, time.perf_counter() - start)
