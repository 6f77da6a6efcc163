"""Run metadata: the software versions stored with every run. (Model and drafter identities are
the runtime's, `runtime.session.model_identity`, so that artifacts are checked against the same ids.)"""

from __future__ import annotations

import platform
from importlib import metadata


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
