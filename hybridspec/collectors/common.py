"""What every calibration pass shares: the campaign configuration, the pass context, units of
work, the reporter interface, and the expert-counting helpers of DESIGN A.5 / A.9.

A pass is a module with one class exposing

    name                      the pass name (`runs.pass`)
    params(ctx) -> dict       its parameters (stored as `runs.params`; a resume must match them)
    units(ctx) -> [Unit]      every unit of work of the whole run, in a fixed order (shards take
                              every n-th unit, so the union over shards is the whole run)
    prepare(ctx)              per-process set-up and warm-up (nothing recorded)
    collect(ctx, item) -> {table: [row dict]}   one unit's rows, committed by the driver in one
                              transaction with the unit's done marker
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, Protocol

import torch
from torch import Tensor

from ..runtime.session import Session

ALL_PASSES = ("capture", "fixed", "stage0", "moe", "routing")  # `all`: what `fit` needs
PASS_NAMES = (*ALL_PASSES, "profile")  # profile: the cost profile by module, only when named
DEFAULT_NEW_TOKENS = 128  # output limit per prompt of capture and eval (`--max-new-tokens`)
QUICK_PROMPTS_PER_CATEGORY = 2  # capture and eval with --quick: the first prompts of each category
# measurement blocks of the Stage-0 and MoE benches: every length once per block, `PER_BLOCK` samples
BLOCKS, PER_BLOCK, WARMUP = 10, 3, 5  # 30 samples per length
QUICK_BLOCKS, QUICK_PER_BLOCK, QUICK_WARMUP = 4, 2, 2


class CaptureConfigError(ValueError):
    """A capture option that cannot be used; the message names the option."""


def parse_passes(text: str) -> tuple[str, ...]:
    """`capture,fixed`, `all` or `all,profile` → pass names in the canonical order (`all`: the passes
    `fit` needs)."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if "all" in names:
        names = [*ALL_PASSES, *(n for n in names if n != "all")]
    check_passes(names, repr(text))
    return tuple(p for p in PASS_NAMES if p in names)


def check_passes(names: Sequence[str], given: str) -> None:
    """Every name one of `PASS_NAMES`, and at least one; `given` is the option as the user wrote it."""
    bad = [p for p in names if p not in PASS_NAMES]
    if bad or not names:
        raise CaptureConfigError(f"--passes {given}: unknown pass {bad[0] if bad else '(none)'!r}; "
                                 f"choose from {', '.join(PASS_NAMES)} or all")


def parse_shard(text: str) -> tuple[int, int]:
    """`i/n` (0 ≤ i < n) → (i, n)."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise CaptureConfigError(f"--shard {text!r}: expected i/n with integers, e.g. 0/2") from None
    check_shard(index, count, repr(text))
    return index, count


def check_shard(index: int, count: int, given: str) -> None:
    if count < 1 or not 0 <= index < count:
        raise CaptureConfigError(f"--shard {given}: need n ≥ 1 and 0 ≤ i < n (shards are numbered 0…n−1)")


def check_run_options(config, error: type[ValueError]) -> None:
    """The options `capture` and `eval` share: --resume/--overwrite, --name, --max-new-tokens, --split,
    --threads."""
    if config.resume and config.overwrite:
        raise error("--resume and --overwrite exclude each other")
    if not config.name or any(c in config.name for c in "\0\n"):
        raise error(f"--name {config.name!r}: must be a non-empty single line")
    if config.max_new_tokens is not None and config.max_new_tokens < 2:
        raise error(f"--max-new-tokens {config.max_new_tokens}: must be ≥ 2")
    if config.split not in ("calib", "test"):
        raise error(f"--split {config.split!r}: calib or test")
    if config.threads is not None and config.threads < 1:
        raise error(f"--threads {config.threads}: must be ≥ 1")


class OutputLimit:
    """`new_tokens` of a run's configuration: `max_new_tokens` when given, else `DEFAULT_NEW_TOKENS`,
    or the class's `quick_new_tokens` with --quick."""

    quick_new_tokens: ClassVar[int]

    @property
    def new_tokens(self) -> int:
        if self.max_new_tokens is not None:
            return self.max_new_tokens
        return self.quick_new_tokens if self.quick else DEFAULT_NEW_TOKENS


@dataclass(frozen=True)
class CaptureConfig(OutputLimit):
    """One `hybridspec capture` invocation (CLI values; validated on construction)."""

    quick_new_tokens: ClassVar[int] = 64

    model: str | None = None  # None: the embedded default pair
    drafter: str | None = None
    prompts: Path | None = None  # None: the embedded prompt set
    split: str = "calib"
    db: Path = Path("capture.duckdb")
    name: str = "default"
    passes: tuple[str, ...] = ALL_PASSES
    max_new_tokens: int | None = None  # None: 128, or 64 with quick
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "auto"
    graphs: bool = True  # False: the resident round without CUDA graphs (--no-graphs)
    quick: bool = False
    resume: bool = False
    overwrite: bool = False
    shard: tuple[int, int] = (0, 1)
    seed: int = 0
    threads: int | None = None  # torch CPU threads; None: 1 on a CPU device (workbench.runinfo.set_threads)
    categories: tuple[str, ...] | None = None  # None: every category of the split
    tp: int = 1  # tensor-parallel ranks (`collectors/parallel.py`)
    expert_parallel: bool = False  # with tp > 1: the experts split whole across the ranks
    nproc: int = 1  # data-parallel processes, shard i/nproc each, merged into `db`

    def __post_init__(self):
        check_run_options(self, CaptureConfigError)
        if self.tp < 1 or self.nproc < 1:
            raise CaptureConfigError(f"--tp {self.tp} / --nproc {self.nproc}: each must be ≥ 1")
        if self.expert_parallel and self.tp < 2:
            raise CaptureConfigError(f"--expert-parallel splits the experts across the tensor-parallel ranks: it needs "
                                     f"--tp 2 or more (got --tp {self.tp})")
        if self.nproc > 1 and self.tp > 1:
            raise CaptureConfigError(f"--nproc {self.nproc} with --tp {self.tp}: data-parallel processes of "
                                     "tensor-parallel ranks are not supported; choose one")
        if self.nproc > 1 and self.shard != (0, 1):
            raise CaptureConfigError(f"--nproc {self.nproc} runs its own shards (i/{self.nproc}, one per process): "
                                     f"it excludes --shard {self.shard[0]}/{self.shard[1]}")
        check_passes(self.passes, ",".join(self.passes))
        check_shard(*self.shard, "/".join(map(str, self.shard)))


@dataclass(frozen=True)
class PromptIds:
    """A prompt ready to decode."""

    id: str
    category: str
    split: str
    ids: tuple[int, ...]


@dataclass
class PassContext:
    config: CaptureConfig
    session: Session
    prompts: list[PromptIds]  # the calibration prompts of the campaign (after --quick), file order
    prompt_set: str  # sha256 of the prompt file (part of every run's params)
    run_id: str = ""  # the run of the pass being collected (set by the driver)
    device: torch.device = field(init=False)

    def __post_init__(self):
        self.device = torch.device(self.config.device)

    @property
    def draft_len(self) -> int:
        return self.session.drafter.draft_len  # D

    @property
    def max_length(self) -> int:
        return self.draft_len + 1  # W

    def base_params(self) -> dict:
        c = self.config
        return {"split": c.split, "quick": c.quick, "prompt_set": self.prompt_set, "seed": c.seed,
                "prompt_ids": [p.id for p in self.prompts],
                **({"categories": list(c.categories)} if c.categories else {})}

    def timed_params(self) -> dict:
        """`base_params` of a pass whose latencies are fitted or reported (fixed, stage0, moe, eval), and
        `graphs`: whether its calls ran as CUDA graphs (`--graphs/--no-graphs`). Eager and replayed
        timings are different runs; so are other thread counts and GPUs (`store.TIMED_PASSES`)."""
        return {**self.base_params(), "graphs": self.config.graphs}


@dataclass(frozen=True)
class Unit:
    key: str  # unique within the run (`units.unit`)
    item: object  # what `collect` gets


class CollectorPass(Protocol):
    name: str

    def params(self, ctx: PassContext) -> dict: ...
    def units(self, ctx: PassContext) -> list[Unit]: ...
    def prepare(self, ctx: PassContext) -> None: ...
    def collect(self, ctx: PassContext, item) -> dict[str, list[dict]]: ...


def block_order(values: list, seed: int, block: int) -> list:
    """`values` in a random order drawn from (seed, block): every block measures every value once, and
    the order differs between blocks, so drift of the machine during a pass spreads over every value
    alike instead of entering the fit as a function of the value (DESIGN A.9)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + block)
    return [values[i] for i in torch.randperm(len(values), generator=generator).tolist()]


def block_counts(ctx: PassContext) -> tuple[int, int, int]:
    """(blocks, samples per block, warm-up calls) of a bench pass (Stage 0, MoE)."""
    return (QUICK_BLOCKS, QUICK_PER_BLOCK, QUICK_WARMUP) if ctx.config.quick else (BLOCKS, PER_BLOCK, WARMUP)


def prompt_row(run_id: str, prompt: PromptIds) -> dict:
    return {"run_id": run_id, "prompt_id": prompt.id, "category": prompt.category, "split": prompt.split,
            "prompt_tokens": len(prompt.ids)}


def new_experts_per_token(expert_ids: Tensor) -> list[int]:
    """[T, k] expert ids of T consecutive tokens → for each token, how many experts it selects that
    no earlier token of the T selected (U(t+1) − U(t) of DESIGN A.5; token 0 counts all its own)."""
    seen: set[int] = set()
    out = []
    for row in expert_ids.tolist():
        fresh = set(row) - seen
        out.append(len(fresh))
        seen |= fresh
    return out


def known_acceptance(position: int, accepted: int, w: int) -> bool | None:
    """A_D ≥ i for draft position i, from a round that verified w − 1 draft tokens and accepted A.

    True for i ≤ A; False after a rejection was seen (A < w − 1); unknown (None) beyond the
    verified tokens when all of them were accepted."""
    if position <= accepted:
        return True
    if accepted < w - 1:
        return False
    return None


def generate_fully_verified(ctx: "PassContext", prompt: PromptIds, policy, *, record_routing: bool = False):
    """Greedy rounds of `prompt` under the output limit N = max_new_tokens, each verifying all of its
    w tokens: the engine shortens rounds near its own output limit, so it runs with N + W and the
    rounds that start at or after token N are dropped; a round that crosses N keeps `emitted` cut to
    N and `truncated = True`, exactly as a run limited to N would emit (DESIGN A.1)."""
    limit = ctx.config.new_tokens
    result = ctx.session.engine.generate(list(prompt.ids), policy=policy, max_new_tokens=limit + ctx.max_length,
                                         eos_ids=ctx.session.eos_ids, record_routing=record_routing)
    rounds, produced = [], 1  # the prefill emits the first anchor
    for record in result.rounds:
        if produced >= limit:
            break
        emitted = min(record.emitted, limit - produced)
        rounds.append(replace(record, emitted=emitted, truncated=record.truncated or emitted < record.emitted))
        produced += record.emitted
    return rounds


def microseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e6
