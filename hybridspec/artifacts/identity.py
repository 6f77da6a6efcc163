"""Content identities of models: sha256 over a directory's config.json and weight files (or a
preset's config and seed), so an artifact can name the exact pair it was fitted for."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

CHUNK = 1 << 20


def directory_id(directory: Path) -> str:
    """sha256 of config.json and every *.safetensors file (sorted names, bytes in chunks)."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in [directory / "config.json", *sorted(directory.glob("*.safetensors"))]:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as f:
            while block := f.read(CHUNK):
                digest.update(block)
    return "sha256:" + digest.hexdigest()


def preset_id(name: str, config: dict, seed: int) -> str:
    payload = json.dumps({"preset": name, "config": config, "seed": seed}, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(payload).hexdigest()
