"""The calibration store's schema (DESIGN B.7): tables, natural keys and migrations.

Every table that holds measurements has a PRIMARY KEY on its natural key, so a row can never be
written twice; `units` holds one "unit done" marker per finished unit of work (a prompt's rounds
`prompt:…`; a measurement block of timings, `block=b:prompt:…` for the fixed pass and `block=b` for
the Stage-0 and MoE benches; a policy's request `policy=…:prompt:…`; a piece of the cost profile),
written in the same transaction as the unit's rows. Lengths `w`, `u` count the anchor; `position`
is the draft position i = 1…D (the token d_i, index i of the target input (x0, d1, …, dD)).
Latencies are microseconds.

A migration is a list of SQL statements taking the schema from version v − 1 to v; `MIGRATIONS[v]`
is applied in one transaction and recorded in `schema_version`. Version 2 adds the tables of
`hybridspec eval` (measured requests and rounds per policy) and the offline estimates; version 3
the host, thread count and measurement order (`block`, `block_order`) of timed runs; version 4 the
cost profile (`capture --passes profile`).

`TABLE_DOCS` and `COLUMN_DOCS` say what every table and column holds; `docs/store.md` is generated
from them and the migrated schema (`workbench/schema_docs.py`), and a test keeps the three equal.
"""

from __future__ import annotations

SCHEMA_VERSION = 4

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
    "cost_profile": ("run_id", "w", "part"),
    "profile_calls": ("run_id", "call_idx"),
}

# tables whose rows belong to units (everything but the run metadata)
DATA_TABLES = tuple(t for t in KEYS if t not in ("runs", "run_shards"))
# the tables of `hybridspec eval` runs (the calibration passes write the others)
EVAL_TABLES = ("eval_requests", "eval_rounds", "offline_estimates")
# the tables of the opt-in profile pass (`capture --passes profile`)
PROFILE_TABLES = ("cost_profile", "profile_calls")

_V1 = [
    """CREATE TABLE runs (
        run_id VARCHAR PRIMARY KEY,
        name VARCHAR NOT NULL,
        pass VARCHAR NOT NULL,
        status VARCHAR NOT NULL,
        model_id VARCHAR NOT NULL,
        drafter_id VARCHAR,
        model VARCHAR,
        drafter VARCHAR,
        device VARCHAR NOT NULL,
        dtype VARCHAR NOT NULL,
        backend VARCHAR NOT NULL,
        versions JSON NOT NULL,
        params JSON NOT NULL,
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
        accepted INTEGER NOT NULL,
        accepted_full INTEGER,
        emitted INTEGER NOT NULL, truncated BOOLEAN NOT NULL,
        latency_us DOUBLE NOT NULL,
        draft_us DOUBLE, stage0_us DOUBLE, stage1_us DOUBLE, commit_us DOUBLE,
        PRIMARY KEY (run_id, prompt_id, round_idx)
    )""",
    """CREATE TABLE draft_positions (
        run_id VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        position INTEGER NOT NULL,
        token_id INTEGER NOT NULL, confidence DOUBLE NOT NULL, entropy DOUBLE NOT NULL,
        accepted BOOLEAN,
        new_l0_experts INTEGER,
        PRIMARY KEY (run_id, prompt_id, round_idx, position)
    )""",
    """CREATE TABLE fixed_length_timings (
        run_id VARCHAR NOT NULL, w INTEGER NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        latency_us DOUBLE NOT NULL,
        executed_w INTEGER NOT NULL,
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
        new_l0_experts INTEGER NOT NULL,
        new_later_pairs INTEGER NOT NULL,
        PRIMARY KEY (run_id, prompt_id, round_idx, position)
    )""",
]

# eval runs (pass 'eval'): one unit per (policy, prompt); the offline estimates are one more unit
_V2 = [
    """CREATE TABLE eval_requests (
        run_id VARCHAR NOT NULL, policy VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, category VARCHAR NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        emitted_tokens INTEGER NOT NULL,
        rounds INTEGER NOT NULL,
        decode_seconds DOUBLE NOT NULL,
        mean_w DOUBLE NOT NULL,
        mismatch_position INTEGER,
        finish_reason VARCHAR NOT NULL,
        token_ids VARCHAR NOT NULL,
        PRIMARY KEY (run_id, policy, prompt_id)
    )""",
    """CREATE TABLE eval_rounds (
        run_id VARCHAR NOT NULL, policy VARCHAR NOT NULL, prompt_id VARCHAR NOT NULL, round_idx INTEGER NOT NULL,
        w0 INTEGER, u INTEGER NOT NULL, w INTEGER NOT NULL, accepted INTEGER NOT NULL, emitted INTEGER NOT NULL,
        truncated BOOLEAN NOT NULL, latency_us DOUBLE NOT NULL,
        PRIMARY KEY (run_id, policy, prompt_id, round_idx)
    )""",
    """CREATE TABLE offline_estimates (
        run_id VARCHAR NOT NULL,
        capture_run_id VARCHAR NOT NULL,
        policy VARCHAR NOT NULL,
        category VARCHAR NOT NULL,
        rounds INTEGER NOT NULL, emitted INTEGER NOT NULL, al DOUBLE NOT NULL, mean_w DOUBLE NOT NULL,
        est_seconds DOUBLE NOT NULL, tps DOUBLE NOT NULL, sr DOUBLE NOT NULL,
        PRIMARY KEY (run_id, policy, category)
    )""",
]

# v3: the host, thread count and measurement order of timed runs (DESIGN A.9 interleaved blocks)
_V3 = [
    "ALTER TABLE runs ADD COLUMN threads INTEGER",
    "ALTER TABLE runs ADD COLUMN host_cpu VARCHAR",
    "ALTER TABLE runs ADD COLUMN host_gpu VARCHAR",
    *(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER" for table in ("fixed_length_timings", "stage0_timings",
                                                                         "moe_bench") for column in ("block", "block_order")),
]

# v4: the cost profile (the paper's Table 4 and Figure 1b)
_V4 = [
    """CREATE TABLE cost_profile (
        run_id VARCHAR NOT NULL, w INTEGER NOT NULL, part VARCHAR NOT NULL,
        kernel_us DOUBLE NOT NULL, kernels DOUBLE NOT NULL, latency_us DOUBLE NOT NULL,
        context_tokens INTEGER NOT NULL, attribution VARCHAR NOT NULL,
        PRIMARY KEY (run_id, w, part)
    )""",
    """CREATE TABLE profile_calls (
        run_id VARCHAR NOT NULL, call_idx INTEGER NOT NULL, w INTEGER NOT NULL,
        distinct_pairs INTEGER NOT NULL, latency_us DOUBLE NOT NULL,
        PRIMARY KEY (run_id, call_idx)
    )""",
]

MIGRATIONS: dict[int, list[str]] = {1: _V1, 2: _V2, 3: _V3, 4: _V4}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))

# ---------------------------------------------------------------- documentation (docs/store.md)
TABLE_DOCS: dict[str, str] = {
    "schema_version": "One row per migration applied to the file (the file's version is the largest).",
    "runs": "One row per run: a (campaign name, pass) pair. Shards of one run share the row.",
    "run_shards": "One row per shard of a run (`capture --shard i/n`), with the host that ran it.",
    "units": "One \"unit done\" marker per finished unit of work, written in the same transaction as the "
             "unit's rows; `--resume` skips the units listed here.",
    "prompts": "The prompts a run decoded.",
    "rounds": "One row per round of the capture pass (every draft token verified, w = W).",
    "draft_positions": "One row per draft token of a capture round.",
    "fixed_length_timings": "One row per round of the fixed-length pass (the C_tgt fit).",
    "stage0_timings": "One latency sample of Stage 0 (Layer-0 GDN + router) per row (the s fit).",
    "moe_bench": "One latency sample of one MoE layer's expert computation per row (the η fit).",
    "routing_positions": "One row per draft position of the routing run (the n̄_all tables).",
    "eval_requests": "One row per (policy, prompt) decoded by `hybridspec eval`.",
    "eval_rounds": "One row per round of an `hybridspec eval` request.",
    "offline_estimates": "Per policy and category: the capture rounds replayed with the artifact's cost model.",
    "cost_profile": "Where one verification pass of w tokens spends its device time, by module (the profile "
                    "pass; the paper's Table 4), and the drafter's pass (part `drafter`).",
    "profile_calls": "One timed verification call per row with the distinct (layer, expert) pairs it routes to "
                     "(the profile pass; the paper's Figure 1b).",
}

_TIMED = {
    "block": "measurement block: every length is measured once per block, in a seeded random order "
             "(the fixed pass: one block per prompt); NULL in stores written before schema version 3",
    "block_order": "position of this length in its block's random order (0 = first); NULL before version 3",
}

COLUMN_DOCS: dict[str, dict[str, str]] = {
    "schema_version": {"version": "schema version a migration brought the file to",
                       "applied_at": "when it was applied (UTC)"},
    "runs": {
        "run_id": "sha256(name, pass)[:16]: shards of one run share it",
        "name": "the campaign name (`--name`)",
        "pass": "capture, fixed, stage0, moe, routing or eval",
        "status": "running, or finished once every shard is",
        "model_id": "sha256 of config.json and the weight files (a preset: its config and seed)",
        "drafter_id": "the same for the drafter; NULL without one",
        "model": "the `--model` given (for people; `model_id` is the identity)",
        "drafter": "the `--drafter` given",
        "device": "cpu or cuda",
        "dtype": "float32, bfloat16 or float16",
        "backend": "torch, triton or triton-torch-gdn (the resolved `--backend`)",
        "versions": "JSON: python, torch, triton, transformers, numpy, scipy, scikit-learn, statsmodels, duckdb, "
                    "polars, hybridspec",
        "params": "JSON: the pass's parameters (prompts, lengths, samples, blocks, warm-up, seed, …)",
        "shard_count": "how many shards the run was split into",
        "started_at": "earliest shard start (UTC)",
        "finished_at": "latest shard finish (UTC); NULL while running",
        "threads": "torch CPU threads of the process that started the run",
        "host_cpu": "CPU model of that host",
        "host_gpu": "GPU model of the run's CUDA device; NULL on a CPU run",
    },
    "run_shards": {"run_id": "the run", "shard_index": "i of `--shard i/n`", "shard_count": "n",
                   "status": "running or finished", "host": "host name", "started_at": "UTC",
                   "finished_at": "UTC; NULL while running"},
    "units": {"run_id": "the run", "unit": "the unit's key, e.g. `prompt:code-3` or `block=2`",
              "shard_index": "the shard that committed it", "row_count": "rows the unit wrote",
              "finished_at": "commit time (UTC)"},
    "prompts": {"run_id": "the run", "prompt_id": "id in the prompt file", "category": "prompt category",
                "split": "calib or test", "prompt_tokens": "prompt length in tokens"},
    "rounds": {
        "run_id": "the capture run", "prompt_id": "the prompt", "round_idx": "0-based round of the request",
        "w0": "the selector's nominal length (NULL when no selector ran)", "u": "Stage-0 tokens",
        "w": "verification length (counts the anchor)", "accepted": "A: accepted draft tokens",
        "accepted_full": "A_D; NULL when not every draft token was verified",
        "emitted": "tokens emitted (A + 1, cut at EOS or the output limit)",
        "truncated": "the round was cut by EOS or the output limit (left out of every fit)",
        "latency_us": "the whole round (draft … commit), µs", "draft_us": "drafter pass, µs",
        "stage0_us": "Stage 0, µs", "stage1_us": "Stage 1, µs", "commit_us": "commit, µs",
    },
    "draft_positions": {
        "run_id": "the capture run", "prompt_id": "the prompt", "round_idx": "the round",
        "position": "draft position i = 1…D", "token_id": "the draft token d_i",
        "confidence": "drafter top-1 probability conf_i", "entropy": "drafter entropy h_i (nats)",
        "accepted": "A_D ≥ i; NULL when the round did not verify far enough to know",
        "new_l0_experts": "Layer-0 experts d_i adds to those of x0, d1…d_{i−1}; NULL if not recorded",
    },
    "fixed_length_timings": {
        "run_id": "the fixed run", "w": "the fixed verification length (1: an ar step, no draft)",
        "prompt_id": "the prompt", "round_idx": "the round", "latency_us": "the whole round, µs",
        "executed_w": "executed length (< w where the output limit shortened the round)",
        "accepted": "A", "emitted": "tokens emitted", "truncated": "cut by EOS or the output limit", **_TIMED,
    },
    "stage0_timings": {"run_id": "the stage0 run", "u": "Stage-0 tokens", "sample_idx": "sample number of this u",
                       "latency_us": "one Stage-0 call, µs", "context_tokens": "committed context length",
                       **_TIMED},
    "moe_bench": {"run_id": "the moe run", "layer": "the MoE layer timed", "n_rows": "tokens (rows) per call",
                  "n_assignments": "token–expert assignments (rows × top-k), fixed",
                  "n_distinct_experts": "distinct experts among them", "sample_idx": "sample number of this count",
                  "latency_us": "one expert computation, µs", **_TIMED},
    "routing_positions": {"run_id": "the routing run", "prompt_id": "the prompt", "round_idx": "the round",
                          "position": "draft position i", "new_l0_experts": "n0: new Layer-0 experts of d_i",
                          "new_later_pairs": "n>0: new (layer, expert) pairs of d_i in MoE layers 1…L−1"},
    "eval_requests": {
        "run_id": "the eval run", "policy": "length policy", "prompt_id": "the prompt", "category": "its category",
        "prompt_tokens": "prompt length", "emitted_tokens": "tokens after the prefill-produced anchor (DESIGN A.10)",
        "rounds": "verification rounds (ar: target passes)", "decode_seconds": "wall clock after the anchor",
        "mean_w": "mean executed verification length (ar: 1)",
        "mismatch_position": "first index where the output differs from ar's; NULL: equal, or sampled",
        "finish_reason": "eos or length", "token_ids": "the generated ids as a JSON list, anchor first",
    },
    "eval_rounds": {"run_id": "the eval run", "policy": "length policy", "prompt_id": "the prompt",
                    "round_idx": "the round", "w0": "nominal length (NULL for rules without one)",
                    "u": "Stage-0 tokens", "w": "executed verification length", "accepted": "A",
                    "emitted": "tokens emitted", "truncated": "cut by EOS or the output limit",
                    "latency_us": "the whole round, µs"},
    "offline_estimates": {
        "run_id": "the eval run they are printed beside", "capture_run_id": "the capture rounds they replay",
        "policy": "length policy", "category": "prompt category; 'all': sums of rounds/emitted/seconds, means "
                                              "over categories of the rest",
        "rounds": "replayed rounds", "emitted": "estimated emitted tokens", "al": "tokens per round",
        "mean_w": "mean verification length", "est_seconds": "estimated decode seconds",
        "tps": "estimated tokens per second", "sr": "estimated speed-up over ar",
    },
    "cost_profile": {
        "run_id": "the profile run", "w": "verification length (part `drafter`: the drafter's block size)",
        "part": "gdn, attention (softmax), moe (router, routed and shared experts), other (embedding, norms "
                "between blocks, LM head), or drafter (its context extension and one proposal)",
        "kernel_us": "device time of the part's kernels per pass, µs (CPU: its operators' own time)",
        "kernels": "kernels (CPU: operators) of the part per pass",
        "latency_us": "median latency of the whole pass, µs (a CUDA graph's replay on a GPU; the drafter's "
                      "pass eager); the same on every part of one w",
        "context_tokens": "committed context before the pass",
        "attribution": "how kernels were assigned to parts: `gpu ranges` (the module's span on the device) "
                       "or `launching op` (the operator that launched it)",
    },
    "profile_calls": {"run_id": "the profile run", "call_idx": "call number", "w": "verification length",
                      "distinct_pairs": "distinct (MoE layer, expert) pairs the call's tokens route to",
                      "latency_us": "median latency of the call, µs (a CUDA graph's replay on a GPU)"},
}
