"""Read and write `PolicyParameters` as one JSON file of numbers.

This interim format carries exactly the policy parameters; the frozen artifact of `hybridspec fit`
(safetensors tensors + validated metadata and hashes) supersedes it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from .params import AcceptanceModel, PolicyParameters


class ArtifactError(ValueError):
    """An artifact file that cannot be used."""


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def save_parameters(params: PolicyParameters, path: Path) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps({"format": "hybridspec-policy-parameters", "version": 1, **asdict(params)}))
    tmp.replace(path)  # never a half-written file


def load_parameters(path: Path) -> PolicyParameters:
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such artifact file")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not a JSON policy-parameter file ({exc})") from exc
    if raw.pop("format", None) != "hybridspec-policy-parameters" or raw.pop("version", None) != 1:
        raise ArtifactError(f"{path}: not a hybridspec policy-parameter file (format/version fields)")
    try:
        acceptance = AcceptanceModel(**{k: _tuples(v) for k, v in raw.pop("acceptance").items()})
        return PolicyParameters(acceptance=acceptance, **{k: _tuples(v) for k, v in raw.items()})
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: {exc}") from exc
