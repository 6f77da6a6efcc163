"""Command-line overrides of the drafter's settings and shape, their validation, and the deadline
that ends drafter training early."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from hybridspec.training.drafter import DrafterSettings, DrafterShape
from hybridspec.training.embedded import RECIPES, main, override, train_embedded


def test_override_parses_each_value_as_its_fields_type():
    got = override(DrafterSettings(), ["distill_mix=1.0", "steps=40000", "lr=5e-4", "labels=corpus"], "--drafter-set")
    assert (got.distill_mix, got.steps, got.lr, got.labels) == (1.0, 40000, 5e-4, "corpus")
    assert type(got.steps) is int and type(got.lr) is float
    assert override(DrafterShape(), [], "--drafter-shape") == DrafterShape()


@pytest.mark.parametrize("assignment,message", [
    ("distill_mixx=1", "DrafterSettings has no field 'distill_mixx'"),
    ("steps=1.5", "steps takes int values"),
    ("steps", "expected KEY=VALUE"),
    ("distill_mix=2", r"need 0 <= distill_mix <= 1"),
    ("position_decay=0", r"need 0 < position_decay <= 1"),
])
def test_override_errors_name_the_option_and_the_field(assignment, message):
    with pytest.raises(ValueError, match=message) as info:
        override(DrafterSettings(), [assignment], "--drafter-set")
    if "need" not in message:
        assert str(info.value).startswith(f"--drafter-set '{assignment}'")


def test_shape_is_validated():
    with pytest.raises(ValueError, match="not a multiple"):
        override(DrafterShape(), ["num_attention_heads=3"], "--drafter-shape")


def test_cli_rejects_a_bad_override_before_any_work(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--recipe", "tiny", "--drafter-set", "nope=1"])
    assert "DrafterSettings has no field 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--recipe", "tiny", "--target-dir", str(tmp_path), "--drafter-init",
              str(tmp_path), "--drafter-shape", "num_hidden_layers=3"])
    assert "cannot reshape" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_deadline_ends_drafter_training_and_the_lr_schedule_with_it(tmp_path):
    tiny = RECIPES["tiny"]
    recipe = replace(tiny, drafter_train=override(tiny.drafter_train, ["steps=1000000", "time_limit_s=600"], "-"))
    started = time.time()
    record = train_embedded(tmp_path, recipe, "cpu", log=lambda m: None, deadline=time.time())
    drafter = record["drafter"]
    assert drafter["time_limit_s"] == 1.0 and drafter["steps_done"] < 1000000
    assert time.time() - started < 60
