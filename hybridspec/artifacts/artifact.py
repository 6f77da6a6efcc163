"""The frozen artifact (DESIGN B.8): one safetensors file — tensors for the acceptance model, the
C_tgt table and the routing tables — whose header metadata holds one JSON object with the
scalars, identities and diagnostics. Numbers only, no pickles.

`content_sha256` covers the canonical JSON of every other metadata field and each tensor's name,
dtype, shape and bytes; `load_artifact` recomputes it and validates the rest (every field's type,
every tensor's dtype, rank and finiteness, then `PolicyParameters`' own checks) before returning the
runtime's `PolicyParameters`. A hash proves only that the file is as written, not that it is
sound: a damaged or hand-made file fails with an `ArtifactError` naming the field, never anything else."""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from .params import AcceptanceModel, PolicyParameters

SCHEMA_VERSION = 1
META_KEY = "hybridspec_artifact"
NUMBER, INTEGER = "number", "integer"  # JSON kinds of the numeric fields (never bool, always finite)
META_TYPES = {"schema_version": INTEGER, "rho": NUMBER, "s": NUMBER, "eta": NUMBER, "fixed_cost": NUMBER,
              "draft_len": INTEGER, "lengths": list, "model_id": str, "drafter_id": str, "device": str,
              "store_digest": str, "created_at": str, "diagnostics": dict, "content_sha256": str}
REQUIRED_META = tuple(META_TYPES)
TENSOR_SPECS = {"acceptance.coef": (torch.float64, 1), "acceptance.iso_x": (torch.float64, 1),
                "acceptance.iso_y": (torch.float64, 1), "acceptance.iso_offsets": (torch.int64, 1),
                "cost": (torch.float64, 1), "nbar_all": (torch.float64, 1), "nbar_cond": (torch.float64, 2)}
REQUIRED_TENSORS = tuple(TENSOR_SPECS)


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
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # raw bytes of any dtype
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
    # written by Python's open, whose mode follows the umask (safetensors' own writer makes it owner-only)
    tmp.write_bytes(save(tensors, metadata={META_KEY: json.dumps(meta, sort_keys=True)}))
    tmp.replace(path)
    return meta


def _read(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    if not path.is_file():
        what = "a directory, not an artifact file" if path.is_dir() else "no such artifact file"
        raise ArtifactError(f"{path}: {what}")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{path}: not a readable artifact (truncated or corrupt safetensors: {exc})") from None
    except Exception as exc:  # noqa: BLE001 (safetensors on damaged bytes: a dtype torch lacks, …)
        raise ArtifactError(f"{path}: not a readable artifact (corrupt safetensors: {type(exc).__name__}: {exc})"
                            ) from None
    if META_KEY not in header:
        raise ArtifactError(f"{path}: safetensors file without hybridspec metadata ('{META_KEY}')")
    try:
        meta = json.loads(header[META_KEY])
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{path}: metadata is not valid JSON ({exc.msg} at {exc.pos})") from None
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits; nesting too deep
        raise ArtifactError(f"{path}: metadata is not readable JSON ({type(exc).__name__})") from None
    if not isinstance(meta, dict):
        raise ArtifactError(f"{path}: metadata is a JSON {type(meta).__name__}, not an object")
    return meta, tensors


def _kind_ok(value, kind) -> bool:
    if kind in (NUMBER, INTEGER):
        numeric = int if kind == INTEGER else (int, float)
        return not isinstance(value, bool) and isinstance(value, numeric) and math.isfinite(value)
    return isinstance(value, kind)


def _check_fields(path: Path, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
    """ArtifactError naming the first metadata field or tensor of the wrong type, dtype or rank, or
    with a value that is not finite."""
    for name, kind in META_TYPES.items():
        if not _kind_ok(meta[name], kind):
            want = kind if isinstance(kind, str) else f"JSON {kind.__name__}"
            raise ArtifactError(f"{path}: metadata field {name} must be a finite {want}, got {meta[name]!r:.80}"
                                if kind in (NUMBER, INTEGER) else
                                f"{path}: metadata field {name} must be a {want}, got {meta[name]!r:.80}")
    if not all(_kind_ok(w, INTEGER) for w in meta["lengths"]):
        raise ArtifactError(f"{path}: metadata field lengths must be a list of integers, got {meta['lengths']!r:.80}")
    thresholds = meta["diagnostics"].get("thresholds", {})  # the fit-quality limits `inspect` reapplies
    if not isinstance(thresholds, dict) or not all(_kind_ok(v, NUMBER) for v in thresholds.values()):
        raise ArtifactError(f"{path}: metadata field diagnostics.thresholds must be an object of finite numbers, "
                            f"got {thresholds!r:.80}")
    for name, (dtype, ndim) in TENSOR_SPECS.items():
        t = tensors[name]
        if t.dtype != dtype or t.dim() != ndim:
            raise ArtifactError(f"{path}: tensor {name} must be {ndim}-D {dtype}, got {t.dim()}-D {t.dtype} "
                                f"{tuple(t.shape)}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ArtifactError(f"{path}: tensor {name} holds values that are not finite (NaN or infinity)")


def load_artifact(path: Path) -> tuple[PolicyParameters, dict]:
    """Validate and return (policy parameters, metadata)."""
    path = Path(path)
    meta, tensors = _read(path)
    missing = [k for k in REQUIRED_META if k not in meta]
    if missing:
        raise ArtifactError(f"{path}: metadata lacks {', '.join(missing)}")
    if meta["schema_version"] != SCHEMA_VERSION or isinstance(meta["schema_version"], bool):
        raise ArtifactError(f"{path}: schema_version {meta['schema_version']} is not supported "
                            f"(this hybridspec reads version {SCHEMA_VERSION})")
    missing = [k for k in REQUIRED_TENSORS if k not in tensors]
    if missing:
        raise ArtifactError(f"{path}: tensors {', '.join(missing)} missing")
    _check_fields(path, meta, tensors)
    stored, computed = meta["content_sha256"], content_hash(meta, tensors)
    if stored != computed:
        raise ArtifactError(f"{path}: content hash mismatch (stored {stored}, computed {computed}): "
                            "the file was modified or damaged")
    offsets = tensors["acceptance.iso_offsets"].tolist()
    n_thresholds = len(tensors["acceptance.iso_x"])
    if (len(offsets) != meta["draft_len"] + 1 or offsets[0] != 0 or offsets[-1] != n_thresholds
            or any(b < a for a, b in zip(offsets, offsets[1:])) or len(tensors["acceptance.iso_y"]) != n_thresholds):
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


def identity_mismatch(meta: dict, *, model_id: str, drafter_id: str, source: str = "artifact") -> str:
    """What differs between the model and drafter an artifact was fitted for and the given ones, naming
    both ids ("" when both match)."""
    for what, want, got in (("model", meta["model_id"], model_id), ("drafter", meta["drafter_id"], drafter_id)):
        if want != got:
            return f"{source} was fitted for {what} {want}, but this {what} is {got}"
    return ""


def check_identity(meta: dict, *, model_id: str, drafter_id: str, force: bool = False, source: str = "artifact") -> None:
    """Refuse an artifact fitted for another model or drafter, naming both ids (unless forced)."""
    mismatch = identity_mismatch(meta, model_id=model_id, drafter_id=drafter_id, source=source)
    if mismatch and not force:
        raise ArtifactError(f"{mismatch} (pass --force to use it anyway)")
