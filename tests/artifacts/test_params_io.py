"""Policy parameters: validation on construction and a JSON round trip that refuses bad files."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybridspec.artifacts.io import ArtifactError, load_parameters, save_parameters
from tests.runtime.helpers import policy_parameters


def test_round_trip(tmp_path):
    params = policy_parameters()
    save_parameters(params, tmp_path / "p.json")
    assert load_parameters(tmp_path / "p.json") == params


@pytest.mark.parametrize("change,message", [
    ({"rho": 0.0}, "rho must be > 0"),
    ({"lengths": (1, 2)}, "must lie in 2..16"),
    ({"cost": (0.0,) * 5}, "cost has 5 entries"),
])
def test_invalid_parameters_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(policy_parameters(), **change)


def test_unsorted_isotonic_thresholds_are_refused():
    acc = policy_parameters().acceptance
    with pytest.raises(ValueError, match="position 1 are not sorted"):
        dataclasses.replace(acc, iso_x=((0.5, 0.1, 1.0),) + acc.iso_x[1:])


def test_bad_files_are_named(tmp_path):
    (tmp_path / "a.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="a.json: not a JSON"):
        load_parameters(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ArtifactError, match="format/version"):
        load_parameters(tmp_path / "b.json")
    with pytest.raises(ArtifactError, match="no such artifact"):
        load_parameters(tmp_path / "missing.json")
