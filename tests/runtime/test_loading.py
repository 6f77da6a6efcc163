"""Loading at scale: meta build, header checks, memory check, tensors streamed in chunks straight
into the target dtype, tied weights, and identities that read no weights where the cache knows them."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from hybridspec.artifacts import identity
from hybridspec.artifacts.identity import directory_id, file_digest, sha256_file
from hybridspec.runtime import weights
from hybridspec.runtime.config import ConfigError
from hybridspec.runtime.loading import load_drafter, load_target, torch_dtype
from hybridspec.runtime.session import EMBEDDED
from tests.checkpoints import put_in_hub_cache, reshard, write_tiny_qwen3_5_moe


def _equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].dtype == sb[name].dtype and torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("fixture", ["qwen35_dir", "qwen3next_dir"])
def test_reads_in_small_chunks_equal_whole_reads(fixture, request, monkeypatch):
    """Per-expert rows into the fused expert tensors, qwen3_next's split projections: the same
    weights whether a tensor arrives in one read or in many of a few rows."""
    directory = request.getfixturevalue(fixture)
    whole = load_target(directory)
    monkeypatch.setattr(weights, "CHUNK_BYTES", 100)  # rows of 16 fp32 values: several reads per tensor
    _equal(whole, load_target(directory))


def test_sharded_checkpoint_equals_one_file(tmp_path):
    _equal(load_target(EMBEDDED / "target"), load_target(reshard(EMBEDDED / "target", tmp_path, shards=3)))


def test_bfloat16_load_is_the_checkpoint_rounded_once():
    full, half = load_target(EMBEDDED / "target"), load_target(EMBEDDED / "target", dtype="bfloat16")
    for (name, p), (_, q) in zip(full.named_parameters(), half.named_parameters()):
        assert q.dtype == torch.bfloat16 and torch.equal(p.to(torch.bfloat16), q), name
    assert half.inv_freq.dtype == torch.float32  # RoPE frequencies stay fp32, as transformers keeps them


def test_auto_dtype_is_bfloat16_on_cuda_and_float32_elsewhere():
    assert torch_dtype("auto", "cuda:0") == torch.bfloat16 and torch_dtype("auto", "cpu") == torch.float32
    with pytest.raises(ConfigError, match="not one of auto, float32"):
        torch_dtype("fp8")


def test_tied_embeddings_stay_one_tensor(tmp_path):
    directory = write_tiny_qwen3_5_moe(tmp_path, tie_word_embeddings=True)
    assert not any("lm_head" in n for n in load_file(directory / "model.safetensors"))
    model = load_target(directory)
    assert model.lm_head.weight is model.embed_tokens.weight


def test_the_memory_check_refuses_before_allocating(monkeypatch):
    monkeypatch.setattr(weights, "device_memory", lambda device: (8 << 30, 24 << 30))
    monkeypatch.setattr(weights, "materialize_", lambda *a: pytest.fail("allocated before the memory check"))
    with pytest.raises(ConfigError, match=r"preset qwen3.6-35b-a3b needs 64\.\d GiB for its weights on cpu, "
                                          r"which has 8\.0 GiB free of 24\.0 GiB"):
        load_target("qwen3.6-35b-a3b", dtype="bfloat16")


def test_a_bad_shape_is_named_before_anything_is_allocated(qwen35_dir, tmp_path, monkeypatch):
    shutil.copy(qwen35_dir / "config.json", tmp_path)
    raw = load_file(qwen35_dir / "model.safetensors")
    raw["model.layers.0.mlp.experts.3.up_proj.weight"] = raw["model.layers.0.mlp.experts.3.up_proj.weight"][:-1]
    save_file(raw, tmp_path / "model.safetensors")
    monkeypatch.setattr(weights, "materialize_", lambda *a: pytest.fail("allocated before the header check"))
    with pytest.raises(ConfigError, match=r"experts.3.up_proj.weight has shape \(15, 32\), config implies \(16, 32\)"):
        load_target(tmp_path)


def test_a_missing_expert_and_a_truncated_file_are_named(qwen35_dir, tmp_path):
    shutil.copy(qwen35_dir / "config.json", tmp_path)
    raw = load_file(qwen35_dir / "model.safetensors")
    del raw["model.layers.1.mlp.experts.5.down_proj.weight"]
    save_file(raw, tmp_path / "model.safetensors")
    with pytest.raises(ConfigError, match=r"missing \['layers.1.mlp.experts.down_proj'\]"):
        load_target(tmp_path)
    data = (qwen35_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="truncated"):
        load_target(tmp_path)
    (tmp_path / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\n")
    with pytest.raises(ConfigError, match="not a safetensors file"):
        load_target(tmp_path)


def test_the_drafter_streams_onto_the_targets_device_and_dtype():
    target = load_target(EMBEDDED / "target", dtype="bfloat16")
    drafter = load_drafter(EMBEDDED / "drafter", target.embed_tokens, target.lm_head)
    stored = load_file(EMBEDDED / "drafter" / "model.safetensors")
    for name, p in drafter.named_parameters():
        assert p.dtype == torch.bfloat16 and torch.equal(p, stored[name].to(torch.bfloat16)), name


def test_identity_in_the_hub_cache_reads_the_blob_names_and_equals_the_directorys(tmp_path, monkeypatch):
    snapshot = put_in_hub_cache(tmp_path / "hub", "org/tiny", EMBEDDED / "target", "a" * 40)
    monkeypatch.setattr(identity, "sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    assert file_digest(snapshot / "model.safetensors") == os.path.basename(os.readlink(snapshot / "model.safetensors"))
    monkeypatch.undo()
    assert directory_id(snapshot) == directory_id(EMBEDDED / "target")


def test_identity_of_a_local_dir_download_reads_its_recorded_sha256(tmp_path, monkeypatch):
    shutil.copy(EMBEDDED / "drafter" / "model.safetensors", tmp_path)
    metadata = tmp_path / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    metadata.parent.mkdir(parents=True)
    recorded = sha256_file(tmp_path / "model.safetensors")
    metadata.write_text(f"{'b' * 40}\n{recorded}\n{(tmp_path / 'model.safetensors').stat().st_mtime + 5}\n")
    monkeypatch.setattr(identity, "sha256_file", lambda path: pytest.fail(f"hashed {path}"))
    assert file_digest(tmp_path / "model.safetensors") == recorded


def test_identity_of_a_large_file_samples_it_and_tells_other_weights_apart(tmp_path, monkeypatch):
    """Above FULL_HASH_BYTES, outside any cache: header, size and windows of the data; the same
    shapes with other weights (every tensor changed, as a fine-tune does) get another id."""
    monkeypatch.setattr(identity, "FULL_HASH_BYTES", 0)
    a, b = tmp_path / "a", tmp_path / "b"
    for directory in (a, b):
        directory.mkdir()
        shutil.copy(EMBEDDED / "target" / "config.json", directory)
    tensors = load_file(EMBEDDED / "target" / "model.safetensors")
    save_file(tensors, a / "model.safetensors")
    save_file({n: t + 1e-3 if t.is_floating_point() else t for n, t in tensors.items()}, b / "model.safetensors")
    assert file_digest(a / "model.safetensors").startswith("sampled:")
    assert directory_id(a) != directory_id(b)
    shutil.copy(a / "model.safetensors", b / "model.safetensors")
    assert directory_id(a) == directory_id(b)
    json.loads((a / "config.json").read_text())  # the config is part of the id, read whole
    (b / "config.json").write_text((a / "config.json").read_text().replace("1e-06", "1e-05"))
    assert directory_id(a) != directory_id(b)


def test_eos_ids_include_generation_configs(tmp_path):
    """Chat models end a turn with a token named in generation_config.json (Qwen: <|im_end|>)."""
    from hybridspec.runtime.session import open_session

    shutil.copytree(EMBEDDED / "target", tmp_path / "target")
    (tmp_path / "target" / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 0]}))
    session = open_session(str(tmp_path / "target"), need_drafter=False)
    assert session.eos_ids == (0, 3)
