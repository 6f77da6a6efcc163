"""Model references: a directory, a preset name, or a Hugging Face repo id (`org/name`, optionally
`org/name@revision`) resolved to its snapshot directory in the local Hugging Face cache.

Offline first: the cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`) is
looked up with `local_files_only=True`; only a repo missing from it is downloaded, and only where
`HF_HUB_OFFLINE` is not set. Only the files the runtime reads are fetched (`HUB_FILES`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError
from .presets import PRESETS

HUB_FILES = ["*.json", "*.safetensors", "*.jinja"]  # configs, shard index, shards, tokenizer, chat template
RANDOM = "random"  # the drafter name of a random-weight drafter


class ModelNotFoundError(ConfigError):
    """A repo id that is neither in the local cache nor downloadable now."""


@dataclass(frozen=True, slots=True)
class RepoRef:
    repo_id: str  # org/name
    revision: str | None = None  # branch, tag or commit; None: main

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")

    @property
    def download_command(self) -> str:
        return f"hf download {self.repo_id}" + (f" --revision {self.revision}" if self.revision else "")


def parse_repo_ref(spec: str) -> RepoRef | None:
    """`org/name` or `org/name@revision` as a RepoRef; None for anything else (paths, presets)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id, _, revision = spec.partition("@")
    if repo_id.count("/") != 1 or (_ and not revision):
        return None
    try:
        validate_repo_id(repo_id)
    except HFValidationError:
        return None
    return RepoRef(repo_id, revision or None)


def hub_cache_dir() -> Path:
    """The hub cache as the environment names it now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def snapshot_directory(ref: RepoRef) -> Path:
    """The local snapshot of `ref`: from the cache, else downloaded (not when offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import LocalEntryNotFoundError
    try:
        from huggingface_hub.errors import IncompleteSnapshotError
    except ImportError:  # huggingface_hub without a snapshot completeness check
        IncompleteSnapshotError = ()

    cache = hub_cache_dir()
    args = dict(revision=ref.revision, cache_dir=cache, allow_patterns=HUB_FILES)
    try:
        return Path(snapshot_download(ref.repo_id, local_files_only=True, **args))
    except IncompleteSnapshotError as exc:  # the cached file listing names files the snapshot lacks
        raise ModelNotFoundError(f"{ref}: the cached snapshot in {cache} is incomplete ({exc}); "
                                 f"complete it with `{ref.download_command}`") from None
    except LocalEntryNotFoundError:
        pass
    if offline():
        raise ModelNotFoundError(f"{ref}: not in the Hugging Face cache {cache} (HF_HUB_OFFLINE is set); "
                                 f"download it with `{ref.download_command}`")
    try:
        return Path(snapshot_download(ref.repo_id, **args))
    except Exception as exc:  # no network, unknown or gated repo, disk full: the cause and the way out
        raise ModelNotFoundError(f"{ref}: not in the Hugging Face cache {cache}, and downloading it failed "
                                 f"({type(exc).__name__}: {exc}); download it with `{ref.download_command}` "
                                 "where a network exists") from None


def resolve_reference(spec: str | Path | None) -> str | None:
    """A model or drafter reference as the loaders take it: a directory or a preset name unchanged
    (`random` too), a repo id replaced by its local snapshot directory. Anything else is returned
    as given, for the loaders to report."""
    if spec is None or str(spec) == RANDOM or str(spec) in PRESETS or Path(spec).is_dir():
        return None if spec is None else str(spec)
    ref = parse_repo_ref(str(spec))
    return str(spec) if ref is None else str(snapshot_directory(ref))


def hub_origin(directory: str | Path) -> RepoRef | None:
    """The repo and commit of a snapshot directory of the hub cache (`models--org--name/snapshots/<commit>`)."""
    parts = Path(os.path.abspath(directory)).parts
    if len(parts) < 3 or parts[-2] != "snapshots" or not parts[-3].startswith("models--"):
        return None
    return RepoRef(parts[-3][len("models--"):].replace("--", "/"), parts[-1])


def describe(directory: str | Path) -> str:
    """How a message names a model directory: `org/name@commit (path)` for a cache snapshot."""
    origin = hub_origin(directory)
    return f"{origin} ({directory})" if origin else str(directory)
