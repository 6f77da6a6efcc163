"""Content identities of models, so that an artifact names the exact pair it was fitted for.

A directory's id is the sha256 of `config.json` and, for each `*.safetensors` file (sorted by
name), its name and a digest of its bytes taken without reading the weights where a digest is
already known:
- a file of the Hugging Face cache is a link to `blobs/<sha256 of its bytes>` (the Hub's LFS
  object id), and a file fetched by `hf download --local-dir` has that sha256 in
  `.cache/huggingface/download/<name>.metadata`: the digest is that sha256, read, not computed;
- a file of at most `FULL_HASH_BYTES` is hashed whole, giving the same sha256;
- a larger file elsewhere gets a sampled digest: its safetensors header (every tensor's name, dtype,
  shape and offsets), its size and `SAMPLES` windows of `WINDOW` bytes spread over the data. Two
  checkpoints of equal shapes whose weights differ everywhere (a fine-tune) differ in the windows.
So the same weights have the same id in the cache, in a `--local-dir` copy or (when small) anywhere,
and no load hashes tens of gigabytes. A preset's id is the sha256 of its config and seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from pathlib import Path

CHUNK = 1 << 20
FULL_HASH_BYTES = 256 << 20  # files up to this size are hashed whole
SAMPLES, WINDOW = 64, 1 << 16  # a larger file's sampled digest reads 64 windows of 64 KiB
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def directory_id(directory: Path) -> str:
    """sha256 over config.json's bytes and each *.safetensors file's name and `file_digest`."""
    directory = Path(directory)
    digest = hashlib.sha256()
    digest.update(b"config.json\0" + (directory / "config.json").read_bytes())
    for path in sorted(directory.glob("*.safetensors")):
        digest.update(f"\n{path.name}\0{file_digest(path)}".encode())
    return "sha256:" + digest.hexdigest()


def file_digest(path: Path) -> str:
    """The sha256 of the file's bytes (known or computed), or `sampled:<sha256>` for a large file
    whose sha256 nothing records."""
    known = known_sha256(path)
    if known is not None:
        return known
    if path.stat().st_size <= FULL_HASH_BYTES:
        return sha256_file(path)
    return "sampled:" + sampled_sha256(path)


def known_sha256(path: Path) -> str | None:
    """The sha256 the Hugging Face cache or a `--local-dir` download recorded for the file."""
    if path.is_symlink():
        blob = Path(os.readlink(path)).name  # snapshots/<commit>/<name> → ../../blobs/<etag>
        if _SHA256.match(blob):
            return blob
    metadata = path.parent / ".cache" / "huggingface" / "download" / f"{path.name}.metadata"
    if metadata.is_file():
        lines = metadata.read_text().splitlines()  # commit, etag, download time
        if len(lines) >= 3 and _SHA256.match(lines[1]) and path.stat().st_mtime - 1 <= float(lines[2]):
            return lines[1]
    return None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def sampled_sha256(path: Path) -> str:
    """sha256 of the safetensors header, the file size and `SAMPLES` evenly spaced data windows."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        digest.update(f.read(header_len))
        start = 8 + header_len
        span = max(size - start - WINDOW, 0)
        for i in range(SAMPLES):
            f.seek(start + span * i // max(SAMPLES - 1, 1))
            digest.update(f.read(WINDOW))
    return digest.hexdigest()


def preset_id(name: str, config: dict, seed: int) -> str:
    payload = json.dumps({"preset": name, "config": config, "seed": seed}, sort_keys=True).encode()
    return "sha256:" + hashlib.sha256(payload).hexdigest()
