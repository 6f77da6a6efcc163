"""Run metadata: the software versions, host and thread count stored with every run, and the
thread setting of the processes that time anything. (Model and drafter identities are the
runtime's, `runtime.session.model_identity`, so that artifacts are checked against the same ids.)"""

from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path

# distribution names as installed (importlib.metadata); a missing optional one is left out
PACKAGES = ("torch", "triton", "transformers", "numpy", "scipy", "scikit-learn", "statsmodels", "duckdb", "polars",
            "hybridspec")
OPTIONAL = ("triton", "transformers")


def software_versions() -> dict[str, str]:
    """python and every package of `PACKAGES` ("unknown" for a required one that is not installed)."""
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            if package not in OPTIONAL:
                versions[package] = "unknown"
    return versions


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else what `platform` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def gpu_model(device: str) -> str | None:
    """The name of `device`'s GPU; None for a CPU device."""
    import torch

    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(torch.device(device))


def set_threads(threads: int | None, device: str) -> int:
    """Set torch's CPU thread count and return it. Default (None): one thread per process on a
    CPU device, since a thread team that waits for a descheduled member stalls timed calls when
    other processes share the cores; torch's own default on a GPU device, whose host threads
    only launch kernels."""
    import torch

    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads}: must be ≥ 1")
    if threads is None and torch.device(device).type == "cpu":
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # processes started from this one inherit it
    return torch.get_num_threads()


def file_digest(path: Path) -> str:
    """sha256 hex digest of a file's bytes (the prompt file of a run, the store an artifact was fitted on)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()
