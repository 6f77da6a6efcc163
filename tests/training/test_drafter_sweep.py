"""bench/training/drafter_sweep.py end to end on CPU (--smoke: the tiny recipe's settings, seconds per
process): a continued and a fresh recipe are trained at once against the shipped target, then
measured with the shipped drafter, and the best is copied out."""

from __future__ import annotations

import json
import tarfile

import pytest

from bench.training import drafter_sweep as sweep
from bench.training import embedded_metrics
from hybridspec.runtime.session import EMBEDDED

pytestmark = pytest.mark.skipif(not (EMBEDDED / "drafter" / "config.json").is_file(), reason="embedded pair absent")


def test_smoke_sweep_trains_measures_and_names_the_best(tmp_path, capsys):
    export = tmp_path / "export"
    result = sweep.main(["--smoke", "--out", str(tmp_path / "sweep"), "--recipes", "low-decay,wide",
                         "--export", str(export)])
    tmp_path = tmp_path / "sweep"
    categories = result["categories"]
    assert len(categories) >= 5
    rows = {r["recipe"]: r for r in result["rows"]}
    assert list(rows) == ["shipped", "low-decay", "wide"]
    for name, row in rows.items():
        assert row["complete"], (name, row["status"])
        assert set(row["acceptance_length"]) == set(categories)
        assert all(1.0 <= al <= 16.0 for al in row["acceptance_length"].values())
    wide = json.loads((tmp_path / "runs" / "wide" / "drafter" / "config.json").read_text())
    assert (wide["num_hidden_layers"], wide["intermediate_size"]) == (4, 1024)
    record = json.loads((tmp_path / "runs" / "low-decay" / "training.json").read_text())
    assert record["drafter_init"] and record["drafter"]["settings"]["position_decay"] == 0.7
    assert rows["low-decay"]["held_out_greedy_top1_by_position"] and rows["low-decay"]["steps_done"] >= 1

    best = result["best"]
    assert best["recipe"] == max(("low-decay", "wide"), key=lambda n: rows[n]["mean_al"])
    assert (tmp_path / "best" / "drafter" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "sweep.json").read_text())["best"] == best
    assert "| recipe |" in (tmp_path / "sweep.md").read_text()
    # what a device call brings back: at most 8 files, at most 2 folders down
    files = sorted(p.relative_to(export).as_posix() for p in export.rglob("*") if p.is_file())
    assert files == ["drafter/config.json", "drafter/model.safetensors", "drafters.tar", "logs.tar.gz", "sweep.json",
                     "sweep.md", "training.json"]
    with tarfile.open(export / "drafters.tar") as tar:
        assert {n for n in tar.getnames() if n.endswith("model.safetensors")} == {
            f"runs/{name}/drafter/model.safetensors" for name in ("low-decay", "wide")}
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-5].startswith("recipe") and printed[-1].startswith(f"best: {best['recipe']}")


def test_unknown_recipe_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        sweep.main(["--out", str(tmp_path), "--recipes", "more-data,bogus"])


def test_measuring_some_categories_takes_those_only():
    """The sweep measures groups of categories in separate processes; each must get its own."""
    prompts = EMBEDDED / "prompts.jsonl"
    everything = embedded_metrics.prompts_by_category(prompts, 3)
    some = sorted(everything)[1:3]
    chosen = embedded_metrics.prompts_by_category(prompts, 3, some)
    assert sorted(chosen) == some
    assert all(chosen[c] == everything[c] and len(chosen[c]) == 3 for c in some)
