"""The calibration store's schema (DESIGN B.7): tables, natural keys and migrations.

Every table that holds measurements has a PRIMARY KEY on its natural key, so a row can never be
written twice; `units` holds one "unit done" marker per finished unit of work (a prompt, a
(w, prompt) pair, a Stage-0 length u, a distinct-expert count), written in the same transaction as
the unit's rows. Lengths `w`, `u` count the anchor; `position` is the draft position i = 1…D (the
token d_i, index i of the target input (x0, d1, …, dD)). Latencies are microseconds.

A migration is a list of SQL statements taking the schema from version v − 1 to v; `MIGRATIONS[v]`
is applied in one transaction and recorded in `schema_version`. Version 2 adds the tables of
`hybridspec eval` (measured requests and rounds per policy) and the offline estimates.
"""

from __future__ import annotations

SCHEMA_VERSION = 2

# table → its natural key (the PRIMARY KEY); merge and resume rely on these
KEYS: dict[str, tuple[str, ...]] = {
    "runs": ("run_id",),
    "run_shards": ("run_id", "shard_index"),
    "units": ("run_id", "unit"),
    "prompts": ("run_id", "prompt_id"),
    "rounds": ("run_id", "prompt_id", "round_idx"),
    "draft_positions": ("run_id", "prompt_id", "round_idx", "position"),
    "fixed_length_timings": ("run_id", "w", "prompt_id", "round_idx"),
    "stage0_timings": ("run_id", "u", "sample_idx"),
    "moe_bench": ("run_id", "layer", "n_distinct_experts", "sample_idx"),
    "routing_positions": ("run_id", "prompt_id", "round_idx", "position"),
    "eval_requests": ("run_id", "policy", "prompt_id"),
    "eval_rounds": ("run_id", "policy", "prompt_id", "round_idx"),
    "offline_estimates": ("run_id", "policy", "category"),
}

# tables whose rows belong to units (everything but the run metadata)
DATA_TABLES = tuple(t for t in KEYS if t not in ("runs", "run_shards"))
# the tables of `hybridspec eval` runs (the calibration passes write the others)
EVAL_TABLES = ("eval_requests", "eval_rounds", "offline_estimates")

_V1 = [
    """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,      -- sha256(name, pass)[:16]: shards of one run share it
        name VARCHAR NOT NULL,
        pass VARCHAR NOT NULL,           -- capture, fixed, stage0, moe, routing
        status VARCHAR NOT NULL,         -- running, finished
        model_id VARCHAR NOT NULL,       -- sha256 of config.json + weight files (preset: config + seed)
        drafter_id VARCHAR,
        model VARCHAR,                   -- the --model / --drafter given (for people; ids are the identity)
        drafter VARCHAR,
        device VARCHAR NOT NULL,
        dtype VARCHAR NOT NULL,
        backend VARCHAR NOT NULL,
        versions JSON NOT NULL,          -- python, torch, transformers, hybridspec, duckdb
        params JSON NOT NULL,            -- the pass's parameters (lengths, samples, warm-up, …)
        shard_count INTEGER NOT NULL,
        started_at TIMESTAMP NOT NULL,
        finished_at TIMESTAMP,
        UNIQUE (name, pass)
    )""",
    """CREATE TABLE run_shards (
        run_id VARCHAR NOT NULL, shard_index INTEGER NOT NULL, shard_count INTEGER NOT NULL,
        status VARCHAR NOT NULL, host VARCHAR, started_at TIMESTAMP NOT NULL, finished_at TIMESTAMP,
        PRIMARY KEY (run_id, shard_index)
    )""",
    """CREATE TABLE units (
        run_id VARCHAR NOT NULL, unit VARCHAR NOT NULL, shard_index INTEGER NOT NULL,
        row_count INTEGER NOT NULL, finished_at TIMESTAMP NOT NULL,
        PRIMARY KEY (run_id, unit)
    )""",
    """CREATE TABLE prompts (
        run_id VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, category VARCHAR NOT NULL, split VARCHAR NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        PRIMARY KEY (run_id, prompt_id)
    )""",
    """CREATE TABLE rounds (
        run_id VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        w0 INTEGER, u INTEGER NOT NULL, w INTEGER NOT NULL,
        accepted INTEGER NOT NULL,       -- A
        accepted_full INTEGER,           -- A_D; NULL when not every draft token was verified
        emitted INTEGER NOT NULL, truncated BOOLEAN NOT NULL,
        latency_us DOUBLE NOT NULL,      -- the whole round (draft … commit)
        draft_us DOUBLE, stage0_us DOUBLE, stage1_us DOUBLE, commit_us DOUBLE,
        PRIMARY KEY (run_id, prompt_id, round_idx)
    )""",
    """CREATE TABLE draft_positions (
        run_id VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        position INTEGER NOT NULL,       -- i = 1…D
        token_id INTEGER NOT NULL, confidence DOUBLE NOT NULL, entropy DOUBLE NOT NULL,
        accepted BOOLEAN,                -- A_D ≥ i; NULL when the round did not verify far enough to know
        new_l0_experts INTEGER,          -- Layer-0 experts d_i adds to those of x0, d1…d_{i−1}; NULL if not run
        PRIMARY KEY (run_id, prompt_id, round_idx, position)
    )""",
    """CREATE TABLE fixed_length_timings (
        run_id VARCHAR NOT NULL, w INTEGER NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        latency_us DOUBLE NOT NULL,
        executed_w INTEGER NOT NULL,     -- < w where the output limit shortened the round
        accepted INTEGER NOT NULL, emitted INTEGER NOT NULL, truncated BOOLEAN NOT NULL,
        PRIMARY KEY (run_id, w, prompt_id, round_idx)
    )""",
    """CREATE TABLE stage0_timings (
        run_id VARCHAR NOT NULL, u INTEGER NOT NULL, sample_idx INTEGER NOT NULL,
        latency_us DOUBLE NOT NULL, context_tokens INTEGER NOT NULL,
        PRIMARY KEY (run_id, u, sample_idx)
    )""",
    """CREATE TABLE moe_bench (
        run_id VARCHAR NOT NULL, layer INTEGER NOT NULL, n_rows INTEGER NOT NULL, n_assignments INTEGER NOT NULL,
        n_distinct_experts INTEGER NOT NULL, sample_idx INTEGER NOT NULL, latency_us DOUBLE NOT NULL,
        PRIMARY KEY (run_id, layer, n_distinct_experts, sample_idx)
    )""",
    """CREATE TABLE routing_positions (
        run_id VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        position INTEGER NOT NULL,
        new_l0_experts INTEGER NOT NULL,   -- n0: new Layer-0 experts of d_i
        new_later_pairs INTEGER NOT NULL,  -- n>0: new (layer, expert) pairs of d_i in MoE layers 1…L−1
        PRIMARY KEY (run_id, prompt_id, round_idx, position)
    )""",
]

# eval runs (pass 'eval'): one unit per (policy, prompt); the offline estimates are one more unit
_V2 = [
    """CREATE TABLE eval_requests (
        run_id VARCHAR NOT NULL, policy VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, category VARCHAR NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        emitted_tokens INTEGER NOT NULL,   -- after the prefill-produced anchor (DESIGN A.10)
        rounds INTEGER NOT NULL,           -- verification rounds (ar: target passes)
        decode_seconds DOUBLE NOT NULL,    -- wall clock after the anchor
        mean_w DOUBLE NOT NULL,            -- mean executed verification length (ar: 1)
        mismatch_position INTEGER,         -- first index where the output differs from ar's; NULL: equal, or sampled
        finish_reason VARCHAR NOT NULL,    -- eos or length
        token_ids VARCHAR NOT NULL,        -- the generated ids as a JSON list, anchor first
        PRIMARY KEY (run_id, policy, prompt_id)
    )""",
    """CREATE TABLE eval_rounds (
        run_id VARCHAR NOT NULL, policy VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        w0 INTEGER, u INTEGER NOT NULL, w INTEGER NOT NULL, accepted INTEGER NOT NULL, emitted INTEGER NOT NULL,
        truncated BOOLEAN NOT NULL, latency_us DOUBLE NOT NULL,
        PRIMARY KEY (run_id, policy, prompt_id, round_idx)
    )""",
    """CREATE TABLE offline_estimates (
        run_id VARCHAR NOT NULL,           -- the eval run they are printed beside
        capture_run_id VARCHAR NOT NULL,   -- the capture rounds they replay
        policy VARCHAR NOT NULL,
        category VARCHAR NOT NULL,         -- 'all': sums of rounds/emitted/seconds, means over categories of the rest
        rounds INTEGER NOT NULL, emitted INTEGER NOT NULL, al DOUBLE NOT NULL, mean_w DOUBLE NOT NULL,
        est_seconds DOUBLE NOT NULL, tps DOUBLE NOT NULL, sr DOUBLE NOT NULL,
        PRIMARY KEY (run_id, policy, category)
    )""",
]

MIGRATIONS: dict[int, list[str]] = {1: _V1, 2: _V2}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))
