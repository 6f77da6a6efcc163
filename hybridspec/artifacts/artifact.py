"""The frozen artifact (DESIGN B.8): one safetensors file — tensors for the acceptance model, the
C_tgt table and the routing tables — whose header metadata holds one JSON object with the
scalars, identities and diagnostics. Numbers only, no pickles.

`content_sha256` covers the canonical JSON of every other metadata field and each tensor's name,
dtype, shape and bytes; `load_artifact` recomputes it and validates the rest before returning the
runtime's `PolicyParameters`."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .params import AcceptanceModel, PolicyParameters

SCHEMA_VERSION = 1
META_KEY = "hybridspec_artifact"
REQUIRED_META = ("schema_version", "rho", "s", "eta", "fixed_cost", "draft_len", "lengths", "model_id",
                 "drafter_id", "device", "store_digest", "created_at", "diagnostics", "content_sha256")
REQUIRED_TENSORS = ("acceptance.coef", "acceptance.iso_x", "acceptance.iso_y", "acceptance.iso_offsets", "cost",
                    "nbar_all", "nbar_cond")


class ArtifactError(ValueError):
    """An artifact file that cannot be used; the message names the file and what is wrong."""


def _tensors(params: PolicyParameters, extra: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    acc = params.acceptance
    offsets = np.cumsum([0] + [len(x) for x in acc.iso_x])
    f64 = lambda a: torch.tensor(np.asarray(a, dtype=np.float64))  # noqa: E731
    out = {"acceptance.coef": f64(acc.coef), "acceptance.iso_x": f64(np.concatenate(acc.iso_x)),
           "acceptance.iso_y": f64(np.concatenate(acc.iso_y)),
           "acceptance.iso_offsets": torch.tensor(offsets, dtype=torch.int64),
           "cost": f64(params.cost), "nbar_all": f64(params.nbar_all), "nbar_cond": f64(params.nbar_cond)}
    out.update({name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in extra.items()})
    return out


def content_hash(meta: dict, tensors: dict[str, torch.Tensor]) -> str:
    digest = hashlib.sha256(json.dumps({k: v for k, v in meta.items() if k != "content_sha256"},
                                       sort_keys=True, separators=(",", ":")).encode())
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def save_artifact(path: Path, params: PolicyParameters, *, model_id: str, drafter_id: str, device: str,
                  store_digest: str, diagnostics: dict, extra_tensors: dict[str, np.ndarray] | None = None) -> dict:
    """Write the artifact atomically (temporary file, then rename); returns its metadata."""
    tensors = _tensors(params, extra_tensors or {})
    meta = {"schema_version": SCHEMA_VERSION, "rho": params.rho, "s": params.s, "eta": params.eta,
            "fixed_cost": params.fixed_cost, "draft_len": params.draft_len, "lengths": list(params.lengths),
            "model_id": model_id, "drafter_id": drafter_id, "device": device, "store_digest": store_digest,
            "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "diagnostics": diagnostics}
    meta["content_sha256"] = content_hash(meta, tensors)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, tmp, metadata={META_KEY: json.dumps(meta, sort_keys=True)})
    tmp.replace(path)
    return meta


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    if not path.is_file():
        raise ArtifactError(f"{path}: no such artifact file")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a readable artifact (truncated or corrupt safetensors: {exc})") from None
    if META_KEY not in header:
        raise ArtifactError(f"{path}: safetensors file without hybridspec metadata ('{META_KEY}')")
    try:
        meta = json.loads(header[META_KEY])
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: metadata is not valid JSON ({exc.msg} at {exc.pos})") from None
    return meta, tensors


def load_artifact(path: Path) -> tuple[PolicyParameters, dict]:
    """Validate and return (policy parameters, metadata)."""
    path = Path(path)
    meta, tensors = _read(path)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ArtifactError(f"{path}: metadata lacks {', '.join(missing)}")
    if meta["schema_version"] != SCHEMA_VERSION:
        raise ArtifactError(f"{path}: schema_version {meta['schema_version']} is not supported "
                            f"(this hybridspec reads version {SCHEMA_VERSION})")
    missing = [k for k in REQUIRED_TENSORS if k not in tensors]
    if missing:
        raise ArtifactError(f"{path}: tensors {', '.join(missing)} missing")
    stored, computed = meta["content_sha256"], content_hash(meta, tensors)
    if stored != computed:
        raise ArtifactError(f"{path}: content hash mismatch (stored {stored}, computed {computed}): "
                            "the file was modified or damaged")
    offsets = tensors["acceptance.iso_offsets"].tolist()
    if len(offsets) != meta["draft_len"] + 1 or offsets[0] != 0 or offsets[-1] != len(tensors["acceptance.iso_x"]):
        raise ArtifactError(f"{path}: acceptance.iso_offsets do not partition the isotonic thresholds")
    split = lambda t: tuple(tuple(t[a:b].tolist()) for a, b in zip(offsets, offsets[1:]))  # noqa: E731
    try:
        acceptance = AcceptanceModel(iso_x=split(tensors["acceptance.iso_x"]), iso_y=split(tensors["acceptance.iso_y"]),
                                     coef=tuple(tensors["acceptance.coef"].tolist()))
        params = PolicyParameters(
            draft_len=meta["draft_len"], lengths=tuple(meta["lengths"]), cost=tuple(tensors["cost"].tolist()),
            fixed_cost=meta["fixed_cost"], rho=meta["rho"], s=meta["s"], eta=meta["eta"],
            nbar_all=tuple(tensors["nbar_all"].tolist()),
            nbar_cond=tuple(tuple(row) for row in tensors["nbar_cond"].tolist()), acceptance=acceptance)
    except ValueError as exc:
        raise ArtifactError(f"{path}: {exc}") from None
    return params, meta


def check_identity(meta: dict, *, model_id: str, drafter_id: str, force: bool = False, source: str = "artifact") -> None:
    """Refuse an artifact fitted for another model or drafter, naming both ids (unless forced)."""
    for what, want, got in (("model", meta["model_id"], model_id), ("drafter", meta["drafter_id"], drafter_id)):
        if want != got and not force:
            raise ArtifactError(f"{source} was fitted for {what} {want}, but the loaded {what} is {got} "
                                "(pass --force to use it anyway)")
