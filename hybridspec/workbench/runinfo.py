"""Run metadata: the software versions stored with every run. (Model and drafter identities are
the runtime's, `runtime.session.model_identity`, so that artifacts are checked against the same ids.)"""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata
from pathlib import Path


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


def file_digest(path: Path) -> str:
    """sha256 hex digest of a file's bytes (the prompt file of a run, the store an artifact was fitted on)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
