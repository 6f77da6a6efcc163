"""`resolve_policy`: the one rule generate, serve and eval use for artifacts (needed, valid, fitted
for the pair that runs)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from hybridspec.artifacts.artifact import ArtifactError, save_artifact
from hybridspec.runtime.policies import PolicyError, make_policy, resolve_policy
from tests.runtime.helpers import policy_parameters


@dataclass
class Pair:
    model_id: str
    drafter_id: str | None


@pytest.fixture
def artifact(tmp_path):
    path = tmp_path / "a.safetensors"
    save_artifact(path, policy_parameters(), model_id="sha256:m", drafter_id="sha256:d", device="cpu",
                  store_digest="x", diagnostics={})
    return path


def test_calibrated_policies_need_an_artifact():
    with pytest.raises(PolicyError, match="policies nominal, hybridspec need --artifact"):
        resolve_policy(("ar", "nominal", "hybridspec"), None, Pair("sha256:m", "sha256:d"))
    with pytest.raises(PolicyError, match="policy ratio needs --artifact"):
        resolve_policy("ratio", None, Pair("sha256:m", "sha256:d"))
    assert resolve_policy(("ar", "full", "static:4"), None, Pair("sha256:m", "sha256:d")) == (None, None)


def test_an_artifact_for_another_pair_is_refused_unless_forced(artifact):
    params, meta = resolve_policy("hybridspec", artifact, Pair("sha256:m", "sha256:d"))
    assert params.draft_len == 15 and meta["drafter_id"] == "sha256:d"
    with pytest.raises(ArtifactError, match="sha256:d, but this drafter is sha256:other"):
        resolve_policy("full", artifact, Pair("sha256:m", "sha256:other"))
    assert resolve_policy("full", artifact, Pair("sha256:m", "sha256:other"), force=True)[0] is not None
    assert resolve_policy("ar", artifact, Pair("sha256:other", None))[0] is not None  # no drafter runs


@pytest.mark.parametrize("name", ["static:1", "static:17", "static:x"])
def test_only_make_policy_checks_static_lengths(name):
    with pytest.raises(PolicyError):
        make_policy(name, 15)
    assert make_policy("static:2", 15).length == 2 and make_policy("static:16", 15).length == 16
