"""The frozen artifact: exact round trip, and a clear error for every kind of damage."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from hybridspec.artifacts.artifact import META_KEY, ArtifactError, check_identity, load_artifact, save_artifact
from tests.runtime.helpers import policy_parameters

IDS = dict(model_id="sha256:aaa", drafter_id="sha256:bbb")


def _save(path, params=None, **kw):
    return save_artifact(path, params or policy_parameters(), device="cpu", store_digest="sha256:ccc",
                         diagnostics={"note": "test"}, **{**IDS, **kw})


def test_round_trip_is_exact(tmp_path):
    params = policy_parameters()
    meta = _save(tmp_path / "a.safetensors", params)
    loaded, loaded_meta = load_artifact(tmp_path / "a.safetensors")
    assert loaded == params and loaded_meta == meta
    with safe_open(str(tmp_path / "a.safetensors"), "pt") as f:
        first = {k: f.get_tensor(k) for k in f.keys()}
    _save(tmp_path / "b.safetensors", loaded)
    with safe_open(str(tmp_path / "b.safetensors"), "pt") as f:
        assert all(torch.equal(first[k], f.get_tensor(k)) for k in f.keys()) and set(f.keys()) == set(first)


def test_truncated_file(tmp_path):
    _save(tmp_path / "a.safetensors")
    data = (tmp_path / "a.safetensors").read_bytes()
    (tmp_path / "a.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="truncated or corrupt"):
        load_artifact(tmp_path / "a.safetensors")


def test_flipped_byte_in_the_tensors(tmp_path):
    _save(tmp_path / "a.safetensors")
    data = bytearray((tmp_path / "a.safetensors").read_bytes())
    data[-3] ^= 0x40
    (tmp_path / "a.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="content hash mismatch"):
        load_artifact(tmp_path / "a.safetensors")


def _rewrite_meta(path, change):
    with safe_open(str(path), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        meta = json.loads(f.metadata()[META_KEY])
    change(meta)
    save_file(tensors, path, metadata={META_KEY: json.dumps(meta)})


def test_wrong_schema_version(tmp_path):
    _save(tmp_path / "a.safetensors")
    _rewrite_meta(tmp_path / "a.safetensors", lambda m: m.update(schema_version=2))
    with pytest.raises(ArtifactError, match="schema_version 2 is not supported"):
        load_artifact(tmp_path / "a.safetensors")


def test_missing_key(tmp_path):
    _save(tmp_path / "a.safetensors")
    _rewrite_meta(tmp_path / "a.safetensors", lambda m: m.pop("rho"))
    with pytest.raises(ArtifactError, match="metadata lacks rho"):
        load_artifact(tmp_path / "a.safetensors")


def test_edited_number_breaks_the_hash(tmp_path):
    _save(tmp_path / "a.safetensors")
    _rewrite_meta(tmp_path / "a.safetensors", lambda m: m.update(rho=m["rho"] * 2))
    with pytest.raises(ArtifactError, match="content hash mismatch"):
        load_artifact(tmp_path / "a.safetensors")


def test_invalid_contents_are_refused_on_save_and_named():
    with pytest.raises(ValueError, match="rho must be > 0"):
        dataclasses.replace(policy_parameters(), rho=-1.0)


def test_identity_check_names_both_ids(tmp_path):
    meta = _save(tmp_path / "a.safetensors")
    with pytest.raises(ArtifactError, match="model sha256:aaa, but this model is sha256:xyz"):
        check_identity(meta, model_id="sha256:xyz", drafter_id="sha256:bbb")
    check_identity(meta, model_id="sha256:xyz", drafter_id="sha256:bbb", force=True)
    check_identity(meta, **IDS)


def test_a_directory_is_named_as_one(tmp_path):
    with pytest.raises(ArtifactError, match=": a directory, not an artifact file"):
        load_artifact(tmp_path)


def test_not_an_artifact(tmp_path):
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    with pytest.raises(ArtifactError, match="without hybridspec metadata"):
        load_artifact(tmp_path / "x.safetensors")


def test_the_file_mode_follows_the_umask(tmp_path):
    """Readable by whoever may read the store beside it (a serving account), as the umask allows."""
    import os

    previous = os.umask(0o022)
    try:
        save_artifact(tmp_path / "a.safetensors", policy_parameters(), model_id="sha256:a", drafter_id="sha256:b",
                      device="cpu", store_digest="none", diagnostics={})
        os.umask(0o077)
        save_artifact(tmp_path / "b.safetensors", policy_parameters(), model_id="sha256:a", drafter_id="sha256:b",
                      device="cpu", store_digest="none", diagnostics={})
    finally:
        os.umask(previous)
    assert (tmp_path / "a.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.safetensors").stat().st_mode & 0o777 == 0o600
