"""Run metadata: content identities of models and drafters, and software versions.

`model_id` / `drafter_id` are sha256 hashes of what determines the numbers: a checkpoint
directory's `config.json` and weight files (`*.safetensors`, the shard index), hashed in chunks;
a preset's (random weights) config and seed. Two copies of one checkpoint get the same id.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

CHUNK = 1 << 20  # bytes read at a time


def _update_file(digest, path: Path) -> None:
    digest.update(f"{path.name}\0{path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)


def checkpoint_id(directory: Path) -> str:
    """sha256 over config.json and the weight files of a checkpoint directory (names, sizes, bytes)."""
    directory = Path(directory)
    files = [directory / "config.json", *sorted(directory.glob("*.safetensors")),
             *sorted(directory.glob("*.safetensors.index.json"))]
    missing = [f.name for f in files[:1] if not f.is_file()]
    if missing or len(files) == 1:
        raise FileNotFoundError(f"{directory}: a checkpoint needs config.json and *.safetensors")
    digest = hashlib.sha256(b"hybridspec-checkpoint-v1\0")
    for file in files:
        _update_file(digest, file)
    return digest.hexdigest()


def preset_id(config: dict, seed: int, kind: str = "preset") -> str:
    """sha256 over a preset's (or a random drafter's) config and its weight seed."""
    payload = json.dumps({"kind": kind, "config": config, "seed": seed}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def software_versions() -> dict[str, str]:
    """python, torch, transformers, hybridspec, duckdb (and triton when installed)."""
    versions = {"python": platform.python_version()}
    for package in ("torch", "transformers", "hybridspec", "duckdb", "triton"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            if package != "triton":
                versions[package] = "unknown"
    return versions
