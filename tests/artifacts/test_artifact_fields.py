"""A hash proves only that an artifact is as written: mistyped or non-finite contents whose hash
was recomputed are refused naming the field, and random damage never raises anything but
`ArtifactError`."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from hybridspec.artifacts.artifact import META_KEY, ArtifactError, content_hash, load_artifact, save_artifact
from tests.runtime.helpers import policy_parameters


def _valid(path) -> None:
    save_artifact(path, policy_parameters(), model_id="sha256:a", drafter_id="sha256:b", device="cpu",
                  store_digest="none", diagnostics={"warnings": []})


def _read(path) -> tuple[dict, dict]:
    with safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()[META_KEY]), {k: f.get_tensor(k) for k in f.keys()}


def _rewrite(path, meta: dict, tensors: dict) -> None:
    """Save with the hash recomputed, as a hand-edited or maliciously made file would be."""
    meta = {**meta, "content_sha256": content_hash(meta, tensors)}
    save_file(tensors, path, metadata={META_KEY: json.dumps(meta)})


def _set(key, value):
    return lambda meta, tensors: meta.update({key: value})


def _tensor(key, value):
    return lambda meta, tensors: tensors.update({key: value})


@pytest.mark.parametrize("change, field", [
    (_set("draft_len", "15"), "draft_len"),
    (_set("draft_len", True), "draft_len"),
    (_set("rho", "abc"), "rho"),
    (_set("rho", math.nan), "rho"),
    (_set("s", math.inf), "s"),
    (_set("diagnostics", []), "diagnostics"),
    (_set("diagnostics", {"thresholds": "x"}), "diagnostics.thresholds"),
    (_set("diagnostics", {"thresholds": {"cost_r2": "abc"}}), "diagnostics.thresholds"),
    (_set("diagnostics", {"thresholds": {"cost_r2": True}}), "diagnostics.thresholds"),
    (_set("lengths", [2, "3"]), "lengths"),
    (_set("lengths", [4, 2, 3]), "lengths .* must be increasing"),
    (_set("lengths", [2, 3, 3]), "lengths .* must be increasing"),
    (_set("model_id", 5), "model_id"),
    (_tensor("nbar_cond", torch.ones(17, dtype=torch.float64)), "nbar_cond"),
    (_tensor("cost", torch.full((17,), math.nan, dtype=torch.float64)), "cost"),
    (_tensor("cost", torch.ones(17, dtype=torch.float32)), "cost"),
    (_tensor("acceptance.iso_offsets", torch.arange(16, dtype=torch.int64).flip(0)), "iso_offsets"),
    (_tensor("acceptance.coef", torch.zeros(5, dtype=torch.float64)), "coef"),
    (lambda meta, tensors: tensors["acceptance.iso_y"].add_(4.0), "must be probabilities"),  # not in [0, 1]
])
def test_mistyped_contents_with_a_recomputed_hash_are_refused_by_name(tmp_path, change, field):
    path = tmp_path / "a.safetensors"
    _valid(path)
    meta, tensors = _read(path)
    change(meta, tensors)
    _rewrite(path, meta, tensors)
    with pytest.raises(ArtifactError, match=field):
        load_artifact(path)


def test_meta_that_is_not_an_object(tmp_path):
    path = tmp_path / "a.safetensors"
    _valid(path)
    _, tensors = _read(path)
    save_file(tensors, path, metadata={META_KEY: "[1, 2]"})
    with pytest.raises(ArtifactError, match="not an object"):
        load_artifact(path)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                         max_size=3), max_leaves=6)
TENSORS = st.sampled_from(["acceptance.coef", "acceptance.iso_x", "acceptance.iso_y", "acceptance.iso_offsets", "cost",
                           "nbar_all", "nbar_cond", "extra"])
random_tensors = st.builds(lambda dtype, shape, fill: torch.full(shape, fill).to(dtype),
                           st.sampled_from([torch.float64, torch.float32, torch.int64, torch.bfloat16, torch.bool,
                                            torch.uint8]),
                           st.lists(st.integers(0, 17), max_size=3).map(tuple),
                           st.sampled_from([0.0, 1.0, -1.0, math.nan, math.inf, 16.0]))
mutations = st.one_of(
    st.tuples(st.just("byte"), st.integers(0, 10**6), st.integers(1, 255)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("meta"), st.sampled_from(["schema_version", "rho", "s", "eta", "fixed_cost", "draft_len",
                                                "lengths", "diagnostics", "model_id", "new"]), json_values),
    st.tuples(st.just("drop"), st.sampled_from(["rho", "lengths", "content_sha256"]), st.none()),
    st.tuples(st.just("tensor"), TENSORS, random_tensors),
    st.tuples(st.just("header"), st.binary(max_size=30), st.none()),
)


@pytest.fixture(scope="module")
def valid_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("fuzz") / "valid.safetensors"
    _valid(path)
    return path.read_bytes()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(mutations, min_size=1, max_size=3))
def test_random_damage_raises_only_artifact_error(tmp_path, valid_bytes, steps):
    path = tmp_path / "fuzz.safetensors"
    path.write_bytes(valid_bytes)
    for kind, a, b in steps:
        data = bytearray(path.read_bytes())
        if kind == "byte" and data:
            data[a % len(data)] ^= b
            path.write_bytes(bytes(data))
        elif kind == "truncate":
            path.write_bytes(bytes(data[: a % (len(data) + 1)]))
        elif kind == "header":
            path.write_bytes(len(a).to_bytes(8, "little") + a)
        else:
            try:
                meta, tensors = _read(path)
            except Exception:  # already unreadable: the loader must say so
                continue
            if kind == "meta":
                meta[a] = b
            elif kind == "drop":
                meta.pop(a, None)
            else:
                tensors[a] = b
            _rewrite(path, meta, tensors) if kind != "drop" or a != "content_sha256" else \
                save_file(tensors, path, metadata={META_KEY: json.dumps(meta)})
    try:
        load_artifact(path)
    except ArtifactError as exc:
        assert str(path) in str(exc)
