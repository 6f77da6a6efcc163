"""What the fits, the offline estimates and the report read of a campaign's runs (DESIGN A.9): the
check that a run finished, the capture run's rounds with their draft positions, and the held-out split.

Kept rounds: untruncated (`rounds.truncated`: cut short by EOS or the output limit, so what they
emit depends on where the cut fell) and fully verified (`accepted_full`, A_D, recorded). The
held-out rounds are those of every fifth calibration prompt (ids sorted; split by prompt,
deterministic)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ..workbench.store import Store

HELD_OUT_EVERY = 5  # prompt i of the sorted ids is held out when i % 5 == 4
KEPT_ROUNDS = "NOT r.truncated AND r.accepted_full IS NOT NULL"  # on `rounds r`


def held_out_prompts(prompt_ids: Iterable) -> set:
    """The held-out prompts among `prompt_ids`: every fifth of the sorted distinct ids."""
    prompts = sorted(set(prompt_ids))
    return {p for i, p in enumerate(prompts) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1}


def run_label(store: Store, run: dict) -> str:
    """How errors name a run: its pass, campaign, id and store."""
    return f"the {run['pass']} run of campaign {run['name']!r} (run {run['run_id']}) in {store.path}"


def unfinished_run(store: Store, run: dict) -> str | None:
    """None when `run` (a `runs` row) is finished; else a sentence naming the run, how many of its
    shards finished in this store (`run_shards`) and the command that completes it."""
    if run["status"] == "finished":
        return None
    shards = dict(store.query("SELECT shard_index, status FROM run_shards WHERE run_id = ?", [run["run_id"]]))
    count = run["shard_count"]
    todo = [i for i in range(count) if shards.get(i) != "finished"]
    what = f"{run_label(store, run)} is unfinished (status {run['status']!r})"
    capture = f"hybridspec capture --db {store.path} --name {run['name']} --passes {run['pass']}"
    if count <= 1:
        return (f"{what}: it stopped before its last unit; complete it with `{capture} --resume` and the model "
                "options it was started with")
    shard_runs = " and ".join(f"`{capture} --shard {i}/{count} --resume`" for i in todo)
    return (f"{what}: {count - len(todo)} of {count} shards finished in this store; merge the shards' stores with "
            f"`hybridspec merge OUT {store.path} SHARD_STORE...` and use OUT, or complete the missing shards here "
            f"with {shard_runs} (the model options as before)")


@dataclass(frozen=True)
class CaptureRounds:
    """The kept rounds of a capture run, N rounds ordered by (prompt, round index); draft position
    i in column i − 1, D = the longest position recorded (0 when none is)."""

    run_id: str
    prompt_id: np.ndarray  # [N] str
    category: np.ndarray  # [N] str
    accepted_full: np.ndarray  # [N] A_D
    confidence: np.ndarray  # [N, D] conf_i (NaN: position not recorded)
    entropy: np.ndarray  # [N, D] h_i (NaN: position not recorded)
    new_l0_experts: np.ndarray  # [N, D] new Layer-0 experts of d_i (−1: not recorded)

    @property
    def draft_len(self) -> int:
        return self.confidence.shape[1]

    def held_out(self) -> np.ndarray:
        """[N] bool: the rounds of the held-out prompts (`held_out_prompts`)."""
        return np.isin(self.prompt_id, list(held_out_prompts(self.prompt_id.tolist())))

    def incomplete(self) -> int:
        """How many rounds lack some draft position 1 … D."""
        return int(np.isnan(self.confidence).any(axis=1).sum())


def read_capture_rounds(store: Store, run_id: str) -> CaptureRounds:
    """The kept rounds of capture run `run_id` with their draft positions (N = 0 when none is kept;
    the caller says what is missing)."""
    rounds = store.query(f"SELECT r.prompt_id, r.round_idx, p.category, r.accepted_full FROM rounds r "
                         f"JOIN prompts p USING (run_id, prompt_id) WHERE r.run_id = ? AND {KEPT_ROUNDS} "
                         "ORDER BY r.prompt_id, r.round_idx", [run_id])
    positions = store.query(f"SELECT d.prompt_id, d.round_idx, d.position, d.confidence, d.entropy, d.new_l0_experts "
                            f"FROM draft_positions d JOIN rounds r USING (run_id, prompt_id, round_idx) "
                            f"JOIN prompts p USING (run_id, prompt_id) WHERE d.run_id = ? AND {KEPT_ROUNDS}",
                            [run_id])
    index = {(prompt, idx): k for k, (prompt, idx, _, _) in enumerate(rounds)}
    draft_len = max((position for _, _, position, *_ in positions), default=0)
    shape = (len(rounds), draft_len)
    conf, ent, fresh = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, -1, dtype=np.int64)
    for prompt, idx, position, c, h, new in positions:
        k = index[(prompt, idx)]
        conf[k, position - 1], ent[k, position - 1] = c, h
        fresh[k, position - 1] = -1 if new is None else new
    prompt_id, _, category, accepted_full = list(zip(*rounds)) or [()] * 4
    return CaptureRounds(run_id, np.array(prompt_id, dtype=str), np.array(category, dtype=str),
                         np.array(accepted_full, dtype=np.int64), conf, ent, fresh)
