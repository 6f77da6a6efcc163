"""The one read of a capture run's rounds that the fit, the offline estimate and the report share,
its held-out split, and the refusal of unfinished runs by every reader."""

from __future__ import annotations

import numpy as np
import pytest

from hybridspec.evaluation.offline import OfflineError, find_capture_run, load_capture_rounds
from hybridspec.fitters.campaign import FitError, fit_campaign
from hybridspec.fitters.capture_rounds import HELD_OUT_EVERY, held_out_prompts, read_capture_rounds
from hybridspec.fitters.transfer import transfer_from_store
from hybridspec.workbench.store import RunSpec, Store
from tests.fitters.test_campaign import write_synthetic_store
from tests.runtime.helpers import policy_parameters

D = 3


def _capture(store: Store) -> str:
    """Prompts b (category y) and a (category x), 3 rounds each: b's round 1 truncated, a's round 2
    without A_D; a's round 0 lacks the new experts of position 3."""
    run = store.start_run(RunSpec(name="c", pass_name="capture", model_id="m", drafter_id="d", device="cpu",
                                  dtype="float32", backend="torch"))
    for prompt, category in (("b", "y"), ("a", "x")):
        rows = {"prompts": [dict(run_id=run, prompt_id=prompt, category=category, split="calib", prompt_tokens=5)],
                "rounds": [], "draft_positions": []}
        for r in range(3):
            truncated, a_d = (prompt, r) == ("b", 1), None if (prompt, r) == ("a", 2) else r
            rows["rounds"].append(dict(run_id=run, prompt_id=prompt, round_idx=r, w0=4, u=4, w=4, accepted=r,
                                       accepted_full=a_d, emitted=r + 1, truncated=truncated, latency_us=1.0))
            rows["draft_positions"] += [dict(run_id=run, prompt_id=prompt, round_idx=r, position=i, token_id=1,
                                             confidence=10 * r + i + (prompt == "a") / 2, entropy=-i, accepted=None,
                                             new_l0_experts=None if (prompt, r, i) == ("a", 0, 3) else i + r)
                                        for i in range(1, D + 1)]
        store.commit_unit(run, f"prompt:{prompt}", rows)
    store.finish_shard(run, 0)
    return run


def test_read_capture_rounds_keeps_untruncated_fully_verified_rounds_in_prompt_order(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        rounds = read_capture_rounds(store, _capture(store))
        replayed = load_capture_rounds(store, rounds.run_id, D)
    assert rounds.prompt_id.tolist() == ["a", "a", "b", "b"] and rounds.category.tolist() == ["x", "x", "y", "y"]
    assert rounds.accepted_full.tolist() == [0, 1, 0, 2] and rounds.draft_len == D and rounds.incomplete() == 0
    np.testing.assert_array_equal(rounds.confidence, [[1.5, 2.5, 3.5], [11.5, 12.5, 13.5], [1, 2, 3], [21, 22, 23]])
    np.testing.assert_array_equal(rounds.entropy, np.tile([-1.0, -2.0, -3.0], (4, 1)))
    np.testing.assert_array_equal(rounds.new_l0_experts, [[1, 2, -1], [2, 3, 4], [1, 2, 3], [3, 4, 5]])
    np.testing.assert_array_equal(replayed.confidence, rounds.confidence)  # the estimate reads the same rounds
    np.testing.assert_array_equal(replayed.new_l0_experts, rounds.new_l0_experts)


def test_every_fifth_prompt_by_sorted_id_is_held_out():
    ids = [f"p{i}" for i in range(12)]  # sorted: p0 p1 p10 p11 p2 p3 p4 p5 p6 p7 p8 p9
    assert HELD_OUT_EVERY == 5 and held_out_prompts(reversed(ids)) == {"p2", "p7"}
    assert held_out_prompts(["a", "b", "c", "d"]) == set()


def test_estimate_and_transfer_refuse_an_unfinished_capture(tmp_path):
    db = tmp_path / "stopped.duckdb"
    write_synthetic_store(db, n_rounds=200, finished=False)
    unfinished = r"the capture run of campaign 'synth' .* is unfinished \(status 'running'\): .*--resume`"
    with Store(db, read_only=True) as store:
        for campaign in ("synth", None):
            with pytest.raises(OfflineError, match=unfinished + ".*; only finished capture runs are replayed"):
                find_capture_run(store, campaign)
    params = policy_parameters(15)
    with pytest.raises(FitError, match=unfinished + ".*; only finished runs are fitted"):
        transfer_from_store(db, "synth", params, params)
    with pytest.raises(FitError, match=unfinished):
        fit_campaign(db, "synth")
