"""`hybridspec train-embedded`: build the embedded default pair from the standard library.

    corpus (stdlib sources) → byte-level BPE tokenizer → target (qwen3_5_moe_text, transformers)
    → DFlash drafter against the frozen target → categorized prompt set → DIR/

DIR gets `target/` (config.json, model.safetensors, tokenizer.json), `drafter/` (DFlash
config.json, model.safetensors), `prompts.jsonl` and `training.json` (corpus, settings, losses).
Run as `python -m hybridspec.training.embedded --out DIR [--recipe full|tiny] [--device cuda]`.

    --target-dir T [--drafter-init D]   train only a drafter against the frozen target T (from D)
    --drafter-set KEY=VALUE             override a DrafterSettings field (repeatable; applied last)
    --drafter-shape KEY=VALUE           override a DrafterShape field of a fresh drafter (repeatable)
    --wall-minutes M                    stop drafter training so the command ends within M minutes
    --target-dir T --prompts-only       rebuild only DIR/prompts.jsonl (T's tokenizer, --stdlib's
                                        held-out files): byte-identical to the training run's file
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch

from ..runtime.drafter import DFlashDrafter
from ..runtime.loading import load_drafter, save_drafter
from .corpus import build_corpus
from .drafter import DrafterSettings, DrafterShape, drafter_config, train_drafter
from .prompts import build_prompt_set, write_prompt_set
from .target import TargetShape, TrainSettings, train_target
from .tokenizer import EOS, MASK, train_tokenizer


@dataclass(frozen=True)
class Recipe:
    vocab_size: int = 4096
    held_out_fraction: float = 0.1
    max_files: int | None = None
    target: TargetShape = field(default_factory=TargetShape)
    target_train: TrainSettings = field(default_factory=TrainSettings)
    drafter: DrafterShape = field(default_factory=DrafterShape)
    drafter_train: DrafterSettings = field(default_factory=DrafterSettings)
    prompts_per_category: int = 80
    prompt_context_chars: int = 1200
    seed: int = 0


RECIPES = {
    "full": Recipe(drafter_train=DrafterSettings(
        steps=30000, time_limit_s=330.0, distill_sequences=4096, distill_prefix=128, distill_new_tokens=128,
        distill_batch=1024, distill_mix=0.5)),
    # a CPU smoke configuration: same code path, tiny shapes, a few steps
    "tiny": Recipe(
        vocab_size=400, held_out_fraction=0.3, max_files=60,
        target=TargetShape(vocab_size=400, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, head_dim=16,
                           linear_head_dim=16, num_experts=16, moe_intermediate_size=8,
                           shared_expert_intermediate_size=16),
        target_train=TrainSettings(steps=6, batch_size=4, seq_len=64, warmup=2, time_limit_s=60),
        drafter=DrafterShape(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=32),
        drafter_train=DrafterSettings(steps=4, batch_size=4, seq_len=64, blocks_per_seq=2, warmup=2, time_limit_s=60,
                                      distill_sequences=6, distill_prefix=16, distill_batch=4, distill_mix=0.5),
        prompts_per_category=4, prompt_context_chars=300,
    ),
}


WALL_RESERVE_S = 20.0  # of --wall-minutes, kept for what follows the drafter's training loop


def token_stream(tokenizer, texts: list[str], eos_id: int) -> torch.Tensor:
    ids = []
    for encoding in tokenizer.encode_batch(texts, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eos_id)
    return torch.tensor(ids, dtype=torch.long)


def _save_target(model, directory: Path) -> None:
    model.to(torch.bfloat16).save_pretrained(directory)
    (directory / "generation_config.json").unlink(missing_ok=True)
    model.float()


def override(settings, assignments: list[str], option: str):
    """`settings` (a frozen dataclass) with KEY=VALUE assignments applied, each value parsed as the
    type of the field's default; an unknown key or a bad value names the option and the field."""
    defaults = {f.name: type(f.default) for f in fields(settings)}
    changes = {}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep:
            raise ValueError(f"{option} {assignment!r}: expected KEY=VALUE")
        if key not in defaults:
            raise ValueError(f"{option} {assignment!r}: {type(settings).__name__} has no field {key!r} "
                             f"(fields: {', '.join(defaults)})")
        try:
            changes[key] = _parse_value(text, defaults[key])
        except ValueError:
            raise ValueError(f"{option} {assignment!r}: {key} takes {defaults[key].__name__} values") from None
    try:
        return replace(settings, **changes)  # the dataclass validates the result
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def _parse_value(text: str, kind: type):
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(text)
        return text.lower() == "true"
    return kind(text)


def train_embedded(out: Path, recipe: Recipe, device: str, log=print, *, target_dir: Path | None = None,
                   stdlib: Path | None = None, drafter_init: Path | None = None,
                   deadline: float | None = None) -> dict:
    """Train the whole pair into `out`; with `target_dir`, reuse that trained target (and its
    tokenizer) and train only the drafter and the prompt set. `stdlib`: the standard-library
    folder to read instead of the running interpreter's; `drafter_init`: a drafter directory of this
    target to continue training instead of a fresh one; `deadline` (a `time.time()` value): the
    drafter's training loop ends by then, whatever its time limit."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    corpus = build_corpus(held_out_fraction=recipe.held_out_fraction, max_files=recipe.max_files, root=stdlib)
    log(f"corpus: {corpus.summary()}")
    if target_dir is None:
        tokenizer = train_tokenizer(corpus.texts(held_out=False), recipe.vocab_size)
    else:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    eos_id, mask_id = tokenizer.token_to_id(EOS), tokenizer.token_to_id(MASK)
    train = token_stream(tokenizer, corpus.texts(held_out=False), eos_id)
    held = token_stream(tokenizer, corpus.texts(held_out=True), eos_id)
    log(f"tokens: {len(train)} train, {len(held)} held out ({time.time() - started:.0f}s)")
    shape = replace(recipe.target, vocab_size=tokenizer.get_vocab_size())
    if target_dir is None:
        target, target_record = train_target(shape, recipe.target_train, train, held, eos_id, device, log)
        (out / "target").mkdir(exist_ok=True)
        _save_target(target, out / "target")
        tokenizer.save(str(out / "target" / "tokenizer.json"))
    else:
        from transformers import AutoModelForCausalLM

        target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).to(device).eval()
        target_record = {"reused": str(target_dir)}
        shape = replace(shape, hidden_size=target.config.hidden_size,  # the reused target's, not the recipe's
                        num_hidden_layers=target.config.num_hidden_layers)
    for p in target.parameters():
        p.requires_grad_(False)

    dcfg = drafter_config(recipe.drafter, hidden_size=shape.hidden_size, target_layers=shape.num_hidden_layers,
                          vocab_size=shape.vocab_size, mask_token_id=mask_id)
    torch.manual_seed(recipe.seed)
    if drafter_init is not None:  # continue training a drafter of this target (same shape)
        drafter = load_drafter(drafter_init, target.get_input_embeddings(), target.get_output_embeddings())
        drafter = drafter.to(device=device, dtype=torch.float32)
        log(f"drafter: continuing from {drafter_init}")
    else:
        drafter = DFlashDrafter(dcfg, target.get_input_embeddings(), target.get_output_embeddings()).to(device)
        _init_drafter(drafter)
    drafter_record = train_drafter(drafter, target, recipe.drafter_train, train, held, device, log, deadline=deadline)
    save_drafter(drafter, out / "drafter", num_target_layers=shape.num_hidden_layers, dtype=torch.bfloat16)

    prompts = build_prompt_set(corpus, lambda t: tokenizer.encode(t, add_special_tokens=False).ids,
                               per_category=recipe.prompts_per_category,
                               context_chars=recipe.prompt_context_chars, seed=recipe.seed)
    write_prompt_set(prompts, out / "prompts.jsonl")
    record = {"corpus": corpus.summary(), "tokenizer": {"vocab_size": tokenizer.get_vocab_size(), "eos_id": eos_id,
              "mask_id": mask_id, "train_tokens": len(train), "held_out_tokens": len(held)},
              "recipe": asdict(recipe), "target": target_record, "drafter": drafter_record,
              "drafter_init": None if drafter_init is None else str(drafter_init),
              "prompts": len(prompts), "device": _device_name(device), "torch": torch.__version__,
              "python": platform.python_version(), "seconds": round(time.time() - started, 1)}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    log(f"done in {record['seconds']}s → {out}")
    return record


def _init_drafter(drafter) -> None:
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if p.ndim == 1:
                p.fill_(1.0)
            else:
                torch.nn.init.normal_(p, std=0.02)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if torch.device(device).type == "cuda" else platform.processor() or "cpu"


def recipe_for(name: str, *, target_minutes: float | None = None, drafter_minutes: float | None = None,
               continued: bool = False, drafter_shape: list[str] = (), drafter_set: list[str] = ()) -> Recipe:
    """Recipe `name` with the command line's changes: time caps (minutes), a second drafter stage
    (`continued`: fresh greedy data from another seed, twice the sequences, half the peak lr), and
    KEY=VALUE overrides of the drafter's shape and settings. ValueError naming what is wrong."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r} (recipes: {', '.join(sorted(RECIPES))})")
    recipe = RECIPES[name]
    for flag, minutes in (("--target-minutes", target_minutes), ("--drafter-minutes", drafter_minutes)):
        if minutes is not None and not minutes > 0:
            raise ValueError(f"{flag} must be a positive number of minutes, got {minutes}")
    if target_minutes is not None:
        recipe = replace(recipe, target_train=replace(recipe.target_train, time_limit_s=60 * target_minutes))
    if drafter_minutes is not None:
        recipe = replace(recipe, drafter_train=replace(recipe.drafter_train, time_limit_s=60 * drafter_minutes))
    if continued:
        if drafter_shape:
            raise ValueError("--drafter-shape cannot reshape a drafter continued from --drafter-init")
        d = recipe.drafter_train
        recipe = replace(recipe, drafter_train=replace(d, seed=d.seed + 1, lr=d.lr / 2,
                                                       distill_sequences=2 * d.distill_sequences))
    return replace(recipe, drafter=override(recipe.drafter, list(drafter_shape), "--drafter-shape"),
                   drafter_train=override(recipe.drafter_train, list(drafter_set), "--drafter-set"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="full")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--target-minutes", type=float, help="cap on target training time")
    parser.add_argument("--drafter-minutes", type=float, help="cap on drafter training time")
    parser.add_argument("--target-dir", type=Path, help="reuse this trained target; train the drafter only")
    parser.add_argument("--prompts-only", action="store_true", help="with --target-dir: only write prompts.jsonl")
    parser.add_argument("--stdlib", type=Path, help="standard-library folder to read (default: this interpreter's)")
    parser.add_argument("--drafter-init", type=Path, help="with --target-dir: continue training this drafter")
    parser.add_argument("--drafter-set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a DrafterSettings field, e.g. distill_mix=1.0 (repeatable; applied last)")
    parser.add_argument("--drafter-shape", action="append", default=[], metavar="KEY=VALUE",
                        help="override a DrafterShape field of a fresh drafter, e.g. num_hidden_layers=4 (repeatable)")
    parser.add_argument("--wall-minutes", type=float,
                        help="stop drafter training so that this command ends within this many minutes")
    args = parser.parse_args(argv)
    started = time.time()
    if (args.prompts_only or args.drafter_init) and args.target_dir is None:
        parser.error(f"{'--prompts-only' if args.prompts_only else '--drafter-init'} needs --target-dir (its "
                     "tokenizer.json and the target it was trained against)")
    try:
        recipe = recipe_for(args.recipe, target_minutes=args.target_minutes, drafter_minutes=args.drafter_minutes,
                            continued=args.drafter_init is not None, drafter_shape=args.drafter_shape,
                            drafter_set=args.drafter_set)
    except ValueError as exc:
        parser.error(str(exc))
    if args.prompts_only:
        write_prompts(args.out, args.target_dir, recipe, stdlib=args.stdlib)
        return
    # the final held-out evaluation, saving and the prompt set take well under WALL_RESERVE_S
    deadline = started + 60 * args.wall_minutes - WALL_RESERVE_S if args.wall_minutes else None
    train_embedded(args.out, recipe, args.device, log=lambda m: print(m, flush=True), target_dir=args.target_dir,
                   stdlib=args.stdlib, drafter_init=args.drafter_init, deadline=deadline)


def write_prompts(out: Path, target_dir: Path, recipe: Recipe, *, stdlib: Path | None = None) -> int:
    """The prompt set alone, as `train_embedded` writes it: the held-out files of `stdlib` (default:
    this interpreter's standard library), the target's tokenizer, the recipe's counts and seed."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(target_dir) / "tokenizer.json"))
    corpus = build_corpus(held_out_fraction=recipe.held_out_fraction, max_files=recipe.max_files, root=stdlib)
    prompts = build_prompt_set(corpus, lambda t: tokenizer.encode(t, add_special_tokens=False).ids,
                               per_category=recipe.prompts_per_category,
                               context_chars=recipe.prompt_context_chars, seed=recipe.seed)
    Path(out).mkdir(parents=True, exist_ok=True)
    write_prompt_set(prompts, Path(out) / "prompts.jsonl")
    return len(prompts)


if __name__ == "__main__":
    main()
