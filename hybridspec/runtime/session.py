"""Everything a command needs to decode: target, drafter, engine, text codec, EOS ids.

Every command reaches the models through here (`resolve_pair`, `open_session`, `model_identity`), so
a model or drafter may be named everywhere by a directory, a preset, or a Hugging Face repo id
(`org/name[@revision]`, resolved from the local cache by `hub.resolve_reference`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..artifacts.identity import directory_id, preset_id
from .config import ConfigError, DrafterConfig, TargetConfig
from .drafter import DFlashDrafter
from .engine import Engine
from .hub import resolve_reference
from .loading import drafter_config, load_drafter, load_target, random_drafter, random_drafter_layers, target_config
from .models.hybrid import HybridTarget
from .presets import PRESETS, preset_config
from .sharding import local_config
from .tokenizer import TextCodec, load_codec

EMBEDDED = Path(__file__).resolve().parent.parent / "assets" / "embedded"
FALLBACK_MODEL = "random-tiny"  # when the embedded pair is not installed


def default_model() -> tuple[str, str | None]:
    """(model, drafter) used when none is given: the embedded pair, else `random-tiny`."""
    if (EMBEDDED / "target" / "config.json").is_file():
        return str(EMBEDDED / "target"), str(EMBEDDED / "drafter")
    return FALLBACK_MODEL, None


def resolve_pair(model: str | None, drafter: str | None) -> tuple[str, str | None]:
    """The (model, drafter) a command runs, as local references: the given model, or the default pair
    when none is given (a drafter given alone replaces the default one); a repo id becomes its
    snapshot directory in the Hugging Face cache (`random` and presets stay names)."""
    if model is None:
        model, default_drafter = default_model()
        drafter = drafter or default_drafter
    return resolve_reference(model), resolve_reference(drafter)


def resolve_backend(backend: str, device: str) -> str:
    """`auto` → the Triton kernels on CUDA, the PyTorch reference elsewhere; other names unchanged."""
    if backend != "auto":
        return backend
    return "triton" if str(device).startswith("cuda") else "torch"


@dataclass
class Session:
    model: str
    target: HybridTarget
    drafter: DFlashDrafter | None
    engine: Engine
    codec: TextCodec | None
    eos_ids: tuple[int, ...]
    model_id: str
    drafter_id: str | None

    @property
    def random_weights(self) -> bool:
        return self.model in PRESETS


def check_context(cfg: TargetConfig, max_context: int, remedy: str = "lower --max-context") -> None:
    """ConfigError unless a context of `max_context` tokens fits the model's positions
    (`max_position_embeddings`), checked before any cache is sized for it; `remedy`: what the
    caller's user can change."""
    if max_context > cfg.max_position_embeddings:
        raise ConfigError(f"a context of {max_context} tokens exceeds the model's max_position_embeddings "
                          f"({cfg.max_position_embeddings}): {remedy}")


def open_session(model: str | None = None, drafter: str | None = None, *, need_drafter: bool = True,
                 device: str = "cpu", dtype: str = "auto", backend: str = "auto",
                 max_context: int = 4096, seed: int = 0, graphs: bool = True,
                 tensor_parallel: bool = False, expert_parallel: bool = False) -> Session:
    """Load the target (directory, repo id or preset) and, when needed, the drafter (directory, repo id,
    or `random` for a random one; random presets default to `random`). `dtype` `auto`: bfloat16 on
    CUDA, float32 elsewhere. `graphs=False` (`--no-graphs`): the GPU-resident round runs eagerly, the
    oracle of its CUDA graphs. `tensor_parallel`: inside an initialised process group, only this
    rank's part of the target is loaded, its layers' outputs all-reduced (`tensor_parallel.py`); the
    drafter whole. `expert_parallel`: with it, each rank holds 1/P of the experts whole instead of
    1/P of every expert's columns (`sharding.py`)."""
    backend = resolve_backend(backend, device)
    name = model if model is not None else default_model()[0]  # as given: what outputs call the model
    model, drafter = resolve_pair(model, drafter)
    cfg = target_config(model)
    check_context(cfg, max_context)
    random = drafter in (None, "random")
    features: tuple[int, ...] = ()  # the target layers the drafter reads
    if need_drafter:
        if drafter is None and model not in PRESETS:
            raise ConfigError(f"a speculative policy needs --drafter (a DFlash directory) for {model}")
        if random:
            features = random_drafter_layers(cfg)
        else:
            dcfg = drafter_config(drafter)
            _check_pair(cfg, dcfg, drafter)
            features = dcfg.target_layer_ids
    shard = (0, 1)
    if tensor_parallel:
        import torch.distributed as dist

        shard = (dist.get_rank(), dist.get_world_size())
    target = load_target(model, device=device, dtype=dtype, backend=backend, seed=seed, feature_layers=features,
                         shard=shard, expert_parallel=expert_parallel)
    if tensor_parallel:
        from .tensor_parallel import parallelize

        target = parallelize(target)
    draft = None
    if need_drafter:
        draft = (random_drafter(target, cfg=cfg, seed=seed + 1) if random
                 else load_drafter(drafter, target.embed_tokens, target.lm_head))
    codec = load_codec(Path(model)) if Path(model).is_dir() else None
    engine = Engine(target, draft, max_context=max_context, graphs=None if graphs else False)
    model_id, drafter_id = model_identity(model, drafter if draft is not None else None, seed=seed,
                                          with_drafter=draft is not None)
    return Session(name, target, draft, engine, codec, eos_ids(model, target.cfg), model_id, drafter_id)


def check_tensor_parallel(model: str | None, world: int, expert_parallel: bool = False) -> None:
    """ConfigError, before any rank starts, when the target of `model` (None: the default) cannot be
    split over `world` ranks (`sharding.local_config`), or expert parallelism is asked of one rank."""
    if expert_parallel and world < 2:
        raise ConfigError(f"expert parallelism splits the experts across the tensor-parallel ranks: it needs "
                          f"--tp 2 or more (got --tp {world})")
    local_config(target_config(resolve_pair(model, None)[0]), world, expert_parallel=expert_parallel)


def eos_ids(model: str, cfg: TargetConfig) -> tuple[int, ...]:
    """The config's EOS ids and those of `generation_config.json` (chat models end a turn with their
    own token there, e.g. Qwen's `<|im_end|>`)."""
    ids = list(cfg.eos_token_ids)
    generation = Path(model) / "generation_config.json"
    if generation.is_file():
        extra = json.loads(generation.read_text()).get("eos_token_id")
        ids += [i for i in (extra if isinstance(extra, list) else [extra]) if i is not None and i not in ids]
    return tuple(ids)


def model_identity(model: str, drafter: str | None, *, seed: int = 0, with_drafter: bool = True) -> tuple[str, str | None]:
    """(model_id, drafter_id) content identities, computed without loading any weights: a directory's
    (or repo id's snapshot's) `directory_id`, or the sha256 of a preset's config and seed (`random`
    drafters too)."""
    model, drafter = resolve_reference(model), resolve_reference(drafter)
    model_id = directory_id(Path(model)) if Path(model).is_dir() else preset_id(model, preset_config(model), seed)
    if not with_drafter:
        return model_id, None
    if drafter in (None, "random"):
        return model_id, preset_id("random-drafter", {"target": model_id}, seed + 1)
    return model_id, directory_id(Path(drafter))


def _check_pair(cfg: TargetConfig, dcfg: DrafterConfig, source: str) -> None:
    """A drafter directory's config against its target's: hidden size, tapped layers, mask token."""
    if dcfg.hidden_size != cfg.hidden_size:
        raise ConfigError(f"{source}: drafter hidden size {dcfg.hidden_size} ≠ target hidden size {cfg.hidden_size}")
    bad = [i for i in dcfg.target_layer_ids if not 0 <= i < cfg.num_hidden_layers]
    if bad:
        raise ConfigError(f"{source}: target_layer_ids {bad} outside the target's {cfg.num_hidden_layers} layers")
    if not 0 <= dcfg.mask_token_id < cfg.vocab_size:
        raise ConfigError(f"{source}: mask_token_id {dcfg.mask_token_id} outside the vocabulary ({cfg.vocab_size})")
