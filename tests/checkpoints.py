"""Tiny random Hugging Face checkpoints for oracle tests (written with `save_pretrained`)."""

from __future__ import annotations

from pathlib import Path

import torch

ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
COMMON = dict(
    vocab_size=97, hidden_size=32, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, linear_key_head_dim=8, linear_value_head_dim=12, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_conv_kernel_dim=4, moe_intermediate_size=16,
    shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=2, rope_parameters=ROPE,
)


def randomize_(model: torch.nn.Module, seed: int) -> None:
    """Perturb every weight so that no norm, gate or bias sits at a trivial value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.0, 2.5, generator=gen))
            elif p.ndim == 1:
                p.add_(0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * (0.6 / p.shape[-1] ** 0.5))


def write_tiny_qwen3_5_moe(directory: Path, seed: int = 1, **overrides) -> Path:
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    cfg = Qwen3_5MoeTextConfig(**{**COMMON, **overrides})
    model = Qwen3_5MoeForCausalLM(cfg)
    randomize_(model, seed)
    model.save_pretrained(directory)
    return Path(directory)


def write_tiny_qwen3_next(directory: Path, seed: int = 2, **overrides) -> Path:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    cfg = Qwen3NextConfig(**{**COMMON, "num_experts_per_tok": 3, "norm_topk_prob": False, "mlp_only_layers": [2],
                             "intermediate_size": 40, **overrides})
    model = Qwen3NextForCausalLM(cfg)
    randomize_(model, seed)
    model.save_pretrained(directory)
    return Path(directory)


def hf_logits(directory: Path, ids: list[int]) -> torch.Tensor:
    """Full-sequence logits [T, V] of the transformers model (fp32, eager attention, no cache)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def reshard(source: Path, directory: Path, shards: int) -> Path:
    """`source`'s checkpoint as `shards` safetensors files with a `model.safetensors.index.json`
    (as `save_pretrained` writes large models), beside copies of its other files."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    directory.mkdir(parents=True, exist_ok=True)
    for file in Path(source).iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, directory / file.name)
    tensors = load_file(Path(source) / "model.safetensors")
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i::shards]
        save_file({n: tensors[n] for n in part}, directory / shard, metadata={"format": "pt"})
        weight_map.update({n: shard for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def put_in_hub_cache(hub: Path, repo_id: str, source: Path, commit: str, ref: str | None = "main") -> Path:
    """`source`'s files in the Hugging Face hub cache layout under `hub` (`$HF_HOME/hub`):
    `models--org--name/blobs/<etag>` (sha256 for safetensors files, stored in LFS on the Hub; the git
    blob sha1 for the others), `snapshots/<commit>/<name>` relative links to them, `refs/<ref>`."""
    import hashlib
    import os
    import shutil

    repo = Path(hub) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True, exist_ok=True)
    for file in sorted(Path(source).iterdir()):
        data = file.read_bytes()
        lfs = file.suffix == ".safetensors"
        etag = hashlib.sha256(data).hexdigest() if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        blob = repo / "blobs" / etag
        if not blob.exists():
            shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    if ref is not None:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot
