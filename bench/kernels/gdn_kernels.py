"""GDN verification + commit on one GPU: HybridSpec's Triton kernels against SGLang's and fla's.

    python bench/kernels/gdn_kernels.py --out DIR [--samples 30] [--replays 10] [--quick]
    python bench/kernels/gdn_kernels.py --from-log LOG --bandwidth-from OLD.json --out DIR   # no GPU

Setting: the 30 GDN layers of Qwen3.6-35B-A3B (32 value heads, 16 key heads, dk = dv = 128),
fp32 states, bf16 projections, batch 1; verification widths w in {2, 3, 4, 6, 8, 12, 16} and
committed lengths m = w and m = ceil(w / 2). One round = verify all 30 layers (one call per layer,
as the model does) + commit the accepted state of every layer.

Implementations, each with its native state layout (all four keep S as [HV, dv, dk] with dk
contiguous, so no conversion is needed anywhere):
  hybridspec            what the runtime runs: 30 x `gdn_verify_gated(pending=...)`, each launch first
                        applying the previous round's commit (Eq. 7) to its rows of the state, then
                        verifying (compact factors into the other of two round-buffer slots: z / |k|
                        fp32, g_cum fp32 and the raw bf16 k, `raw_keys`); the commit is deferred
                        to the next round's verification, not skipped: every round reads and
                        writes every state once
  hybridspec_commit     30 x `gdn_verify_gated` (compact factors with the normalised fp32 k into
                        round buffers) + 1 `gdn_commit` launch of its own
  sglang_default        30 x `fused_sigmoid_gating_delta_rule_update` writing the per-token state
                        buffer (`intermediate_states_buffer`, cache_steps = w), then SGLang's
                        `fused_mamba_state_scatter_with_mask` copying step m-1 into the pool
  sglang_replayssm      30 x `gdn_replayssm_spec_decode` (launch_mode="verify", circular ring of
                        16 steps, SGLang's default) + `commit_gdn_replayssm_spec` (cursor advance)
                        + `commit_gdn_replayssm_circular` (folds into the pool when the ring fills)
                        -- what SGLang 0.5.23 runs for GDN under --enable-linear-replayssm-spec
  sglang_replayssm_fold 30 x the default kernel with `cache_ring=True` (raw k, v, g, beta ring) +
                        `commit_gdn_replayssm_fold_all_layers` (gdn_replayssm_spec_fold.py)
  fla_chunk             30 x fla `chunk_gated_delta_rule` over w tokens, then 30 x over the first
                        m tokens with output_final_state=True, copied into the state pool
  floor                 bytes that must move / device-to-device copy bandwidth of this run
SGLang's kernels and ours form g and beta from the raw gate inputs (a, b, A_log, dt_bias) and
L2-normalise q and k themselves inside the timed region (SGLang: use_qk_l2norm_in_kernel=True, as
SGLang calls them; ours: `gdn_verify_gated`, as the runtime calls it). fla takes normalised q, k
and precomputed fp32 g, beta (its gating is outside the timed region).

Timing: per (impl, w, m) ONE CUDA graph holding ROTATIONS = 4 rounds, each on its own input set
and its own state pool (so consecutive rounds touch different memory: the 30 layers' states are
63 MB in fp32, above the H200's 60 MB L2); median over --samples samples of --replays replays,
timed with CUDA events, reported per round. States evolve from round to round (every round
commits), as in decoding; SGLang ReplaySSM's ring cursors advance too, so its periodic folds are
amortised as in serving.

Correctness (printed before any timing; exit status 1 if ours fails): outputs and committed
states of every implementation against Eq. 1 run token by token in float64 on the GPU (the
project's reference computes in fp32 internally, so the oracle is written here), relative
Frobenius error; ours must stay below 1e-5 with fp32 inputs and below 5e-3 with bf16 inputs.

Floor: per round, read S_0 of all layers and write S_m of all layers,
    2 x 30 x 32 x 128 x 128 x 4 B = 125,829,120 B,
plus every layer's inputs and outputs, per token 24,704 B (q, k: 16 x 128 x 2 B each; v and o:
32 x 128 x 2 B each; a, b: 32 x 2 B each), i.e. 741,120 B per token over 30 layers:
    w = 2: 127.3 MB -> 30.3 us,   w = 16: 137.7 MB -> 32.8 us   at 4.2 TB/s (DESIGN C).

Preparation (`.baselines` is git-ignored; the GPU machine has no registry):
    bash ../shared/tools/gdn-baselines.sh        # on a machine with PyPI; copy .baselines over
    python3 -m pip install -q --no-index --no-deps --target .baselines/site .baselines/wheels/*.whl
A baseline that fails to import or run is reported as a row with its error, not a crash.
A run stopped by a time cap before its report leaves every measured row in its log (stdout):
`--from-log` writes the report from it, the unfinished rows marked as not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import sys
import traceback
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from cuda_timing import capture, copy_bandwidth, median_us
from torch import Tensor

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / ".baselines" / "site"
SGLANG_VERSION = "0.5.23"  # what shared/tools/gdn-baselines.sh extracts
WIDTHS = (2, 3, 4, 6, 8, 12, 16)
ROTATIONS = 4  # input sets / state pools per graph
T_MAX = 16  # round-buffer length of the runtime (the verification window W)
REPLAYSSM_RING = 16  # SGLang's default --linear-replayssm-cache-len
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-3}


@dataclass(frozen=True)
class Setting:
    layers: int = 30
    value_heads: int = 32
    key_heads: int = 16
    key_dim: int = 128
    value_dim: int = 128

    @property
    def state_bytes(self) -> int:  # one fp32 state of every layer
        return self.layers * self.value_heads * self.value_dim * self.key_dim * 4

    @property
    def token_bytes(self) -> int:  # inputs and outputs of one token in every layer, bf16
        HK, HV, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        return self.layers * 2 * (2 * HK * dk + 2 * HV * dv + 2 * HV)


QWEN36 = Setting()


@dataclass
class Problem:
    """One input set of a round: the 30 layers' inputs and their states before the round."""

    q: Tensor  # [L, 1, w, HK, dk] L2-normalised, activation dtype
    k: Tensor  # [L, 1, w, HK, dk]
    v: Tensor  # [L, 1, w, HV, dv]
    a: Tensor  # [L, w, HV] raw decay input: g = -exp(A_log) softplus(a + dt_bias)
    b: Tensor  # [L, w, HV] raw write strength: beta = sigmoid(b)
    A_log: Tensor  # [L, HV] fp32
    dt_bias: Tensor  # [L, HV] fp32
    g: Tensor  # [L, 1, w, HV] fp32, the gates precomputed for hybridspec and fla
    beta: Tensor  # [L, 1, w, HV] fp32
    state: Tensor  # [L, 1, HV, dv, dk] fp32 S_0

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5


def gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """SGLang's GDN gating in `dtype`: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    a, b = a.to(dtype), b.to(dtype)  # [L, w, HV]
    g = -A_log.to(dtype)[:, None].exp() * F.softplus(a + dt_bias.to(dtype)[:, None])
    return g, torch.sigmoid(b)


def make_problem(s: Setting, w: int, dtype: torch.dtype, seed: int, device) -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    L, HK, HV, dk, dv = s.layers, s.key_heads, s.value_heads, s.key_dim, s.value_dim

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    q = F.normalize(randn(L, 1, w, HK, dk), dim=-1).to(dtype)
    k = F.normalize(randn(L, 1, w, HK, dk), dim=-1).to(dtype)
    v = randn(L, 1, w, HV, dv).to(dtype)
    a, b = randn(L, w, HV).to(dtype), randn(L, w, HV).to(dtype)
    A_log = (1 + 15 * rand(L, HV)).log()  # A in (1, 16), as Mamba / Qwen3-Next initialise it
    dt_bias = torch.expm1(1e-3 + 0.1 * rand(L, HV)).log()  # softplus(dt_bias) in (1e-3, 0.1)
    g, beta = gates(a, b, A_log, dt_bias, torch.float32)
    state = 0.1 * randn(L, 1, HV, dv, dk)
    return Problem(q, k, v, a, b, A_log, dt_bias, g[:, None], beta[:, None], state)


def oracle(p: Problem, m: int) -> tuple[Tensor, Tensor]:
    """Eq. 1 token by token in float64: o [L, w, HV, dv] and the state after m tokens [L, HV, dv, dk]."""
    group = p.v.shape[3] // p.q.shape[3]
    q = p.q[:, 0].double().repeat_interleave(group, dim=2) * p.scale  # [L, w, HV, dk]
    k = p.k[:, 0].double().repeat_interleave(group, dim=2)  # [L, w, HV, dk]
    v = p.v[:, 0].double()  # [L, w, HV, dv]
    g, beta = gates(p.a, p.b, p.A_log, p.dt_bias, torch.float64)  # [L, w, HV]
    S, S_m, outputs = p.state[:, 0].double(), None, []  # [L, HV, dv, dk]
    for i in range(q.shape[1]):
        S = g[:, i, :, None, None].exp() * S
        z = beta[:, i, :, None] * (v[:, i] - torch.einsum("lhvd,lhd->lhv", S, k[:, i]))
        S = S + z[..., None] * k[:, i, :, None, :]
        outputs.append(torch.einsum("lhvd,lhd->lhv", S, q[:, i]))
        S_m = S if i == m - 1 else S_m
    return torch.stack(outputs, dim=1), S_m


# ---------------------------------------------------------------------------------------------
# Implementations: __init__ allocates (untimed); round() is one verify + commit (graph-captured)
# ---------------------------------------------------------------------------------------------


class HybridSpecCommit:
    """30 x gdn_verify_gated (norms and gates from the raw a, b inside the kernel, as SGLang's
    kernel does) writing z, g_cum, normalised k into round buffers [L, B, T_max, ...], then one
    gdn_commit: the round with its commit as a launch of its own (`hybridspec_commit` rows).
    tuning: the kernels' launch table (`hybridspec.kernels.gdn.tuning.SHIPPED` when None)."""

    rounds_per_cycle = 1

    def __init__(self, p: Problem, w: int, m: int, *, tuning=None):
        from hybridspec.kernels.gdn import triton as gdn

        self.gdn, self.p, self.w = gdn, p, w
        self.tuning = tuning if tuning is not None else gdn.SHIPPED
        L, _, _, HV, dv = p.v.shape
        self.states = p.state.clone()  # [L, 1, HV, dv, dk]
        self.z = torch.empty(L, 1, T_MAX, HV, dv, device=p.v.device)  # [L, B, T_max, HV, dv]
        self.g_cum = torch.empty(L, 1, T_MAX, HV, device=p.v.device)  # [L, B, T_max, HV]
        self.k = torch.empty(L, 1, T_MAX, *p.k.shape[3:], device=p.v.device)  # [L, B, T_max, HK, dk]
        self.accepted = torch.full((1,), m, dtype=torch.long, device=p.v.device)  # [B]
        self.o: list[Tensor] = []

    def round(self) -> None:
        self.verify()
        self.commit()

    def verify(self) -> None:  # the 30 layers' verify launches (bench/kernels/gdn_round_parts.py times them alone)
        p, w = self.p, self.w
        self.o = [self.gdn.gdn_verify_gated(p.q[l], p.k[l], p.v[l], p.a[l, None], p.b[l, None], p.A_log[l],
                                            p.dt_bias[l], self.states[l], p.scale, z_out=self.z[l, :, :w],
                                            g_out=self.g_cum[l, :, :w], k_out=self.k[l, :, :w],
                                            tuning=self.tuning)[0]
                  for l in range(len(self.states))]

    def commit(self) -> None:
        w = self.w
        self.gdn.gdn_commit(self.states, self.z[:, :, :w], self.k[:, :, :w], self.g_cum[:, :, :w], self.accepted,
                            tuning=self.tuning)

    def outputs(self) -> Tensor:  # [L, w, HV, dv]
        return torch.stack(self.o)[:, 0]

    def committed(self) -> Tensor:  # [L, HV, dv, dk]
        return self.states[:, 0]


class HybridSpec:
    """What the runtime runs (`hybridspec` rows): each round's commit is folded into the next round's
    verification of every layer. 30 x gdn_verify_gated(pending=the previous round's z, k, g_cum
    and m): each program applies Eq. 7 to its rows of S, stores them in place, and verifies from
    them; the round's own factors go to the other of two round-buffer slots. Nothing else is
    launched, so a round here is 30 launches that read S once and write it once.

    A CUDA graph fixes the slots' addresses, so the graph holds two rounds of each input set (slot
    0 -> 1, then 1 -> 0; `rounds_per_cycle`): every fold reads the factors its input set's previous
    round wrote. The correctness check runs two rounds (the second folds the first's commit) and
    `committed()` commits what is still pending (the runtime's flush, one gdn_commit).

    The key factors are the raw bf16 keys with z / |k| (`raw_keys`, as the runtime keeps them);
    raw_keys=False keeps the normalised fp32 keys. tuning: the kernels' launch table
    (`hybridspec.kernels.gdn.tuning.SHIPPED` when None)."""

    rounds_per_cycle = 2

    def __init__(self, p: Problem, w: int, m: int, *, tuning=None, raw_keys: bool = True):
        from hybridspec.kernels.gdn import triton as gdn

        self.gdn, self.p, self.w, self.raw_keys = gdn, p, w, raw_keys
        self.tuning = tuning if tuning is not None else gdn.SHIPPED
        L, _, _, HV, dv = p.v.shape
        self.states = p.state.clone()  # [L, 1, HV, dv, dk]
        self.z = torch.empty(2, L, 1, T_MAX, HV, dv, device=p.v.device)  # [slot, L, B, T_max, HV, dv]
        self.g_cum = torch.empty(2, L, 1, T_MAX, HV, device=p.v.device)
        self.k = torch.empty(2, L, 1, T_MAX, *p.k.shape[3:], device=p.v.device,
                             dtype=p.k.dtype if self.raw_keys else torch.float32)
        self.accepted = torch.full((1,), m, dtype=torch.long, device=p.v.device)  # [B]
        self.slot, self.pending = 0, False  # the slot this round writes; a commit pending in the other
        self.o: list[Tensor] = []

    def _pending(self, l: int):
        if not self.pending:
            return None
        old, w = 1 - self.slot, self.w
        return self.z[old, l, :, :w], self.k[old, l, :, :w], self.g_cum[old, l, :, :w], self.accepted

    def round(self) -> None:
        p, w, new = self.p, self.w, self.slot
        self.o = [self.gdn.gdn_verify_gated(p.q[l], p.k[l], p.v[l], p.a[l, None], p.b[l, None], p.A_log[l],
                                            p.dt_bias[l], self.states[l], p.scale, z_out=self.z[new, l, :, :w],
                                            g_out=self.g_cum[new, l, :, :w], k_out=self.k[new, l, :, :w],
                                            pending=self._pending(l), raw_keys=self.raw_keys, tuning=self.tuning)[0]
                  for l in range(len(self.states))]
        self.slot, self.pending = 1 - new, True

    def outputs(self) -> Tensor:  # [L, w, HV, dv]
        return torch.stack(self.o)[:, 0]

    def committed(self) -> Tensor:  # [L, HV, dv, dk]
        if self.pending:
            old, w = 1 - self.slot, self.w
            self.gdn.gdn_commit(self.states, self.z[old, :, :, :w], self.k[old, :, :, :w],
                                self.g_cum[old, :, :, :w], self.accepted, tuning=self.tuning)
            self.pending = False
        return self.states[:, 0]


class SGLangDefault:
    """SGLang's default target verify: the state after every token, then a scatter of step m-1."""

    def __init__(self, p: Problem, w: int, m: int):
        linear = sglang_module("attention.linear.fused_sigmoid_gating_recurrent")
        scatter = sglang_module("mamba.mamba_state_scatter_triton")
        self.verify, self.scatter = linear.fused_sigmoid_gating_delta_rule_update, scatter
        self.p, self.w = p, w
        device = p.v.device
        self.pool = p.state.clone()  # temporal [L, slots = 1, HV, V, K]
        self.steps = torch.empty(*p.state.shape[:2], w, *p.state.shape[2:], device=device)  # [L, 1, w, HV, V, K]
        self.slot = torch.zeros(1, dtype=torch.int32, device=device)  # mamba cache index [B]
        self.last_step = torch.full((1,), m - 1, dtype=torch.int32, device=device)  # [B]
        self.cu_seqlens = torch.tensor([0, w], dtype=torch.int32, device=device)
        self.o: list[Tensor] = []

    def round(self) -> None:
        p = self.p
        self.o = [self.verify(
            A_log=p.A_log[l], a=p.a[l], dt_bias=p.dt_bias[l], softplus_beta=1.0,
            softplus_threshold=20.0, q=p.q[l], k=p.k[l], v=p.v[l], b=p.b[l],
            initial_state_source=self.pool[l], initial_state_indices=self.slot, scale=p.scale,
            use_qk_l2norm_in_kernel=True, cu_seqlens=self.cu_seqlens, is_kda=False,
            disable_state_update=True, intermediate_states_buffer=self.steps[l],
            intermediate_state_indices=self.slot, cache_steps=self.w, retrieve_parent_token=None,
        ) for l in range(len(self.pool))]
        self.scatter.fused_mamba_state_scatter_with_mask(self.pool, self.steps, self.slot, self.last_step)

    def outputs(self) -> Tensor:
        return torch.stack(self.o)[:, 0]

    def committed(self) -> Tensor:
        return self.pool[:, 0]


class SGLangReplaySSM:
    """SGLang's GDN ReplaySSM spec verify: checkpoint + circular (d, k, g) ring, folded when full."""

    def __init__(self, p: Problem, w: int, m: int):
        self.mod = sglang_module("attention.linear.gdn_replayssm_spec_decode")
        self.p, self.w = p, w
        L, _, _, HK, dk = p.k.shape
        HV, dv, device, dtype = p.v.shape[3], p.v.shape[4], p.v.device, p.v.dtype
        self.temporal = p.state.clone()  # checkpoint [L, slots = 1, HV, V, K]
        # compact records follow the activation dtype; bf16 ones keep low parts in the raw rings
        self.d = torch.zeros(L, 1, HV, REPLAYSSM_RING, dv, dtype=dtype, device=device)
        self.k = torch.zeros(L, 1, HK, REPLAYSSM_RING, dk, dtype=dtype, device=device)
        self.g = torch.zeros(L, 1, HV, REPLAYSSM_RING, device=device)
        low = dtype != torch.float32
        self.d_low = torch.zeros_like(self.d) if low else None
        self.k_low = torch.zeros_like(self.k) if low else None
        self.write_pos = torch.zeros(1, dtype=torch.int32, device=device)  # per request slot
        self.cache_base = torch.zeros(1, dtype=torch.int32, device=device)
        self.is_flush = torch.zeros(1, dtype=torch.int8, device=device)
        self.slot = torch.zeros(1, dtype=torch.int32, device=device)  # state and replay index [B]
        self.accepted = torch.full((1,), m, dtype=torch.int32, device=device)  # incl. the bonus token
        self.query_start_loc = torch.tensor([0, w], dtype=torch.int32, device=device)
        self.out = torch.empty(L, w, HV, dv, dtype=dtype, device=device)

    def _layer(self, ring: Tensor | None, l: int) -> Tensor | None:
        return None if ring is None else ring[l]

    def round(self) -> None:
        p, w = self.p, self.w
        HK, dk, HV, dv = p.k.shape[3], p.k.shape[4], p.v.shape[3], p.v.shape[4]
        for l in range(len(self.temporal)):
            self.mod.gdn_replayssm_spec_decode(
                q=p.q[l].view(w, HK, dk), k=p.k[l].view(w, HK, dk), v=p.v[l].view(w, HV, dv),
                a=p.a[l], b=p.b[l], A_log=p.A_log[l], dt_bias=p.dt_bias[l],
                checkpoint_state=self.temporal[l], d_cache=self.d[l], k_cache=self.k[l],
                g_cache=self.g[l], rawv_cache=self._layer(self.d_low, l),
                rawk_cache=self._layer(self.k_low, l), beta_cache=None, out=self.out[l],
                query_start_loc=self.query_start_loc, ssm_state_indices=self.slot,
                replay_indices=self.slot, write_pos=self.write_pos, cache_base=self.cache_base,
                is_flush=self.is_flush, max_cache_len=REPLAYSSM_RING, max_spec_len=w,
                scale=p.scale, use_qk_l2norm_in_kernel=True, null_block_id=-1, launch_mode="verify",
            )
        self.mod.commit_gdn_replayssm_spec(
            write_pos=self.write_pos, cache_base=self.cache_base, is_flush=self.is_flush,
            num_accepted=self.accepted, replay_indices=self.slot, max_cache_len=REPLAYSSM_RING,
            max_spec_len=w, fold_every_commit=self.temporal.dtype != torch.float32, null_block_id=-1,
        )
        self._fold()

    def _fold(self) -> None:
        """commit_gdn_replayssm_circular: folds the ring into the checkpoint on flush rows."""
        self.mod.commit_gdn_replayssm_circular(
            checkpoint_state=self.temporal, d_cache=self.d, k_cache=self.k, g_cache=self.g,
            d_residual_cache=self.d_low, k_residual_cache=self.k_low, state_batch_indices=self.slot,
            replay_indices=self.slot, write_pos=self.write_pos, cache_base=self.cache_base,
            is_flush=self.is_flush, accept_lens=self.accepted, null_block_id=-1,
        )

    def outputs(self) -> Tensor:
        return self.out

    def committed(self) -> Tensor:
        """The committed state lives in checkpoint + ring: force a fold to read it (untimed)."""
        self.is_flush.fill_(1)
        self._fold()
        return self.temporal[:, 0]


class SGLangReplayFold:
    """ReplaySSM fold-every-commit: the default kernel stores raw (k, v, g, beta) of the window in a
    ring; the commit replays the accepted prefix into the checkpoint (gdn_replayssm_spec_fold.py)."""

    def __init__(self, p: Problem, w: int, m: int):
        linear = sglang_module("attention.linear.fused_sigmoid_gating_recurrent")
        self.verify = linear.fused_sigmoid_gating_delta_rule_update
        self.fold = sglang_module("attention.linear.gdn_replayssm_spec_fold")
        self.p = p
        L, _, w, HK, dk = p.k.shape
        HV, dv, device, dtype = p.v.shape[3], p.v.shape[4], p.v.device, p.v.dtype
        self.temporal = p.state.clone()  # [L, slots = 1, HV, V, K]
        self.raw_v = torch.zeros(L, 1, HV, w, dv, dtype=dtype, device=device)  # record length w
        self.raw_k = torch.zeros(L, 1, HK, w, dk, dtype=dtype, device=device)
        self.g = torch.zeros(L, 1, HV, w, device=device)
        self.beta = torch.zeros(L, 1, HV, w, device=device)
        self.slot = torch.zeros(1, dtype=torch.int32, device=device)
        self.accepted = torch.full((1,), m, dtype=torch.int32, device=device)
        self.cu_seqlens = torch.tensor([0, w], dtype=torch.int32, device=device)
        self.o: list[Tensor] = []

    def round(self) -> None:
        p = self.p
        self.o = [self.verify(
            A_log=p.A_log[l], a=p.a[l], dt_bias=p.dt_bias[l], softplus_beta=1.0,
            softplus_threshold=20.0, q=p.q[l], k=p.k[l], v=p.v[l], b=p.b[l],
            initial_state_source=self.temporal[l], initial_state_indices=self.slot, scale=p.scale,
            use_qk_l2norm_in_kernel=True, cu_seqlens=self.cu_seqlens, is_kda=False,
            disable_state_update=True, cache_ring=True, replayssm_rawv=self.raw_v[l],
            replayssm_rawk=self.raw_k[l], replayssm_g=self.g[l], replayssm_beta=self.beta[l],
        ) for l in range(len(self.temporal))]
        self.fold.commit_gdn_replayssm_fold_all_layers(
            checkpoint_state=self.temporal, rawv_cache=self.raw_v, rawk_cache=self.raw_k,
            g_cache=self.g, beta_cache=self.beta, ssm_state_indices=self.slot,
            accept_lens=self.accepted, max_cache_len=self.raw_v.shape[-2],
            num_k_heads=self.raw_k.shape[2], use_qk_l2norm_in_kernel=True, null_block_id=-1,
        )

    def outputs(self) -> Tensor:
        return torch.stack(self.o)[:, 0]

    def committed(self) -> Tensor:
        return self.temporal[:, 0]


class FlaChunk:
    """fla's chunk_gated_delta_rule over the w tokens, then again over the first m for S_m."""

    def __init__(self, p: Problem, w: int, m: int):
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # from .baselines/site

        self.chunk, self.p, self.m = chunk_gated_delta_rule, p, m
        self.states = p.state.clone()  # [L, N = 1, HV, V, K] (state_v_first)
        self.o: list[Tensor] = []

    def _run(self, l: int, tokens: int, final: bool) -> tuple[Tensor, Tensor | None]:
        p, t = self.p, slice(0, tokens)
        return self.chunk(p.q[l][:, t], p.k[l][:, t], p.v[l][:, t], p.g[l][:, t], p.beta[l][:, t],
                          scale=p.scale, initial_state=self.states[l], output_final_state=final,
                          state_v_first=True)

    def round(self) -> None:
        L, w = len(self.states), self.p.q.shape[2]
        self.o = [self._run(l, w, final=False)[0] for l in range(L)]
        for l in range(L):
            self.states[l].copy_(self._run(l, self.m, final=True)[1])

    def outputs(self) -> Tensor:
        return torch.stack(self.o)[:, 0]

    def committed(self) -> Tensor:
        return self.states[:, 0]


IMPLS: dict[str, Callable] = {
    "hybridspec": HybridSpec,
    "hybridspec_commit": HybridSpecCommit,
    "sglang_default": SGLangDefault,
    "sglang_replayssm": SGLangReplaySSM,
    "sglang_replayssm_fold": SGLangReplayFold,
    "fla_chunk": FlaChunk,
}


# ---------------------------------------------------------------------------------------------
# SGLang's kernel files, imported from .baselines/site with stubs for the helpers they import
# ---------------------------------------------------------------------------------------------


def prepare_baselines(capability: tuple[int, int], pdl: bool) -> None:
    """Put .baselines/site (SGLang's kernel files, fla) on sys.path, with stand-ins for the few
    `sglang.srt.utils` / `sglang.kernels.jit.utils` helpers the SGLang files import, answering as
    SGLang would on this device (its SM90 check also needs CUDA >= 12.3)."""
    if "sglang.srt.utils" in sys.modules:
        return
    sys.path.insert(0, str(BASELINES))
    major, minor = capability
    cuda = torch.version.cuda is not None
    cuda_version = tuple(int(x) for x in (torch.version.cuda or "0.0").split(".")[:2])
    helpers = dict(
        is_cuda=lambda: cuda, is_hip=lambda: torch.version.hip is not None,
        is_cpu=lambda: False, is_npu=lambda: False, is_xpu=lambda: False,
        is_gfx95_supported=lambda: False, get_device_sm=lambda: 10 * major + minor,
        is_sm90_supported=lambda: cuda and major == 9 and cuda_version >= (12, 3),
        get_device_core_count=lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count,
        torch_release=tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:3]),
    )

    def stub(name: str, path: Path | None = None, **attrs) -> None:
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        if path is not None:  # a package whose __init__ (importing absent registries) is skipped
            module.__path__ = [str(path)]
        sys.modules[name] = module

    ops = BASELINES / "sglang" / "kernels" / "ops"
    stub("sglang.srt", path=BASELINES / "sglang" / "srt")
    stub("sglang.srt.utils", path=BASELINES / "sglang" / "srt" / "utils", **helpers)
    stub("sglang.srt.utils.common", **helpers)
    stub("sglang.kernels.jit.utils", is_arch_support_pdl=lambda: pdl and cuda and major >= 9)
    stub("sglang.kernels.ops.mamba", path=ops / "mamba")
    stub("sglang.kernels.ops.memory", path=ops / "memory")
    stub("sglang.kernels.ops.memory.ptr_table", make_ptr_table=_no_ptr_table)
    if importlib.util.find_spec("packaging") is None:  # SGLang's fla/utils.py needs it for one flag
        stub("sglang.kernels.ops.attention.fla.utils", is_tf32_supported=cuda and major >= 8)


def _no_ptr_table(*args, **kwargs):
    raise NotImplementedError("make_ptr_table (conv-window scatter) is not needed for the SSM state")


def sglang_module(name: str) -> types.ModuleType:
    if not (BASELINES / "sglang").is_dir():
        raise FileNotFoundError(f"{BASELINES}/sglang is missing: run shared/tools/gdn-baselines.sh")
    return importlib.import_module(f"sglang.kernels.ops.{name}")


# ---------------------------------------------------------------------------------------------
# Phase 1: correctness
# ---------------------------------------------------------------------------------------------


def relative_error(got: Tensor, ref: Tensor) -> float:
    got = got.double()
    if not torch.isfinite(got).all():
        return math.inf
    return ((got - ref).norm() / ref.norm()).item()


def check_one(name: str | Callable, p: Problem, w: int, m: int, o_ref: Tensor, s_ref: Tensor) -> dict:
    """One round against the oracle; for ours (`HybridSpec`, whose commit is folded into the next
    round) a second round on the same inputs too, from the first's committed state: its outputs and
    state against the oracle run from s_ref; the worse of the two rounds is reported. name: a key of
    IMPLS or an implementation's constructor (e.g. `HybridSpec` with other launch parameters)."""
    impl = (IMPLS[name] if isinstance(name, str) else name)(p, w, m)
    impl.round()
    o_err = relative_error(impl.outputs(), o_ref)
    if getattr(impl, "rounds_per_cycle", 1) == 1:
        return dict(o_err=o_err, state_err=relative_error(impl.committed(), s_ref))
    impl.round()  # folds the first round's commit
    o_ref2, s_ref2 = oracle(dataclasses.replace(p, state=s_ref.float()[:, None]), m)
    return dict(o_err=max(o_err, relative_error(impl.outputs(), o_ref2)),
                state_err=relative_error(impl.committed(), s_ref2))


def check_correctness(setting: Setting, configs, impls: dict[str, Callable], device) -> list[dict]:
    """Every implementation (name -> constructor) against the oracle at every (w, m), fp32 and bf16."""
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for w, m in configs:
            p = make_problem(setting, w, dtype, seed=w, device=device)
            o_ref, s_ref = oracle(p, m)
            for name, make in impls.items():
                row = dict(impl=name, dtype=str(dtype).removeprefix("torch."), w=w, m=m)
                try:
                    row.update(check_one(make, p, w, m, o_ref, s_ref))
                    row["passed"] = max(row["o_err"], row["state_err"]) < TOLERANCE[dtype]
                except Exception as error:  # a broken baseline is a row, not a crash
                    row["error"] = describe(error)
                rows.append(row)
    return rows


def describe(error: Exception) -> str:
    frame = traceback.extract_tb(error.__traceback__)[-1]
    return f"{type(error).__name__}: {error} ({Path(frame.filename).name}:{frame.lineno})"[:400]


def correctness_table(rows: list[dict]) -> str:
    """Per implementation and input dtype: the worst relative errors over all (w, m)."""
    lines = ["| impl | inputs | max rel. error o | max rel. error S_m | tolerance | passed |",
             "|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["impl"], r["dtype"]), []).append(r)
    for (impl, dtype), group in groups.items():
        failed = [r for r in group if "error" in r]
        tolerance = TOLERANCE[getattr(torch, dtype)]
        if failed:
            lines.append(f"| {impl} | {dtype} | error (w={failed[0]['w']}): {failed[0]['error']} | | {tolerance:.0e} | no |")
            continue
        o_err, s_err = max(r["o_err"] for r in group), max(r["state_err"] for r in group)
        passed = "yes" if all(r["passed"] for r in group) else "NO"
        lines.append(f"| {impl} | {dtype} | {o_err:.2e} | {s_err:.2e} | {tolerance:.0e} | {passed} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Phase 2: timing
# ---------------------------------------------------------------------------------------------


def time_impl(name: str | Callable, problems: list[Problem], w: int, m: int, samples: int, replays: int) -> float:
    """Median us per round of one CUDA graph of ROTATIONS rounds (name as in `check_one`)."""
    make = IMPLS[name] if isinstance(name, str) else name
    impls = [make(p, w, m) for p in problems]
    cycle = getattr(impls[0], "rounds_per_cycle", 1)  # rounds until an input set's buffers repeat
    graph = capture([impl.round for impl in impls] * cycle)
    result = median_us(graph, len(impls) * cycle, samples, replays)
    del graph, impls
    torch.cuda.empty_cache()
    return result


def floor_us(setting: Setting, w: int, bandwidth: float) -> float:
    return (2 * setting.state_bytes + w * setting.token_bytes) / bandwidth * 1e6


def run_timing(setting: Setting, configs, impls: dict[str, Callable], samples: int, replays: int,
               bandwidth: float) -> list[dict]:
    rows = []
    for w, m in configs:
        problems = [make_problem(setting, w, torch.bfloat16, seed=1000 + r, device="cuda")
                    for r in range(ROTATIONS)]
        for name, make in impls.items():
            row = dict(impl=name, w=w, m=m, median_us=None)
            try:
                row["median_us"] = round(time_impl(make, problems, w, m, samples, replays), 2)
            except Exception as error:
                row["error"] = describe(error)
            print(f"  {name:22s} w={w:2d} m={m:2d}  {row['median_us'] or row.get('error')}", flush=True)
            rows.append(row)
        rows.append(dict(impl="floor", w=w, m=m, median_us=round(floor_us(setting, w, bandwidth), 2)))
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def verification_memory(s: Setting) -> dict[str, int]:
    """Bytes each verifier keeps per request for a window of T_MAX tokens in all layers."""
    L, HK, HV, dk, dv, T = s.layers, s.key_heads, s.value_heads, s.key_dim, s.value_dim, T_MAX
    slot = L * T * (HV * (dv + 1) * 4 + HK * dk * 2)  # z / |k| fp32, g_cum fp32, the raw k bf16
    return {
        "hybridspec (one round's factors: z / |k| fp32, g_cum fp32, raw k bf16)": slot,
        "hybridspec (the runtime's two slots: this round's and the pending commit's)": 2 * slot,
        "sglang_default (per-token states, 16 x 30 x 32 x 128 x 128 x 4 B)": T * L * HV * dv * dk * 4,
        "sglang_replayssm (ring of 16: d, k bf16 + low parts, g fp32)":
            L * REPLAYSSM_RING * (2 * (HV * dv + HK * dk) * 2 + HV * 4),
    }


def timing_table(rows: list[dict]) -> str:
    by_key = {(r["impl"], r["w"], r["m"]): r for r in rows}
    configs = sorted({(r["w"], r["m"]) for r in rows}, key=lambda c: (c[0], -c[1]))
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    head = "| impl | " + " | ".join(f"w={w} m={m}" for w, m in configs) + " |"
    lines = [head, "|---|" + "---|" * len(configs)]
    for name in impls:
        cells = [_cell(by_key.get((name, w, m))) for w, m in configs]
        lines.append(f"| {name} (us) | " + " | ".join(cells) + " |")
    for name in impls:
        if name != "hybridspec":
            label = "ours / floor" if name == "floor" else f"{name} / ours"
            cells = [_ratio(by_key.get((name, w, m)), by_key.get(("hybridspec", w, m)), name == "floor")
                     for w, m in configs]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    return f"{row['median_us']:.1f}" if row["median_us"] is not None else "error"


def _ratio(other: dict | None, ours: dict | None, inverse: bool) -> str:
    if not other or not ours or other["median_us"] is None or ours["median_us"] is None:
        return ""
    ratio = ours["median_us"] / other["median_us"] if inverse else other["median_us"] / ours["median_us"]
    return f"{ratio:.2f}x"


def versions() -> dict[str, str]:
    found = dict(python=platform.python_version(), torch=torch.__version__, cuda=str(torch.version.cuda),
                 sglang_kernels=SGLANG_VERSION)
    for package in ("triton", "fla"):
        try:
            found[package] = importlib.import_module(package).__version__
        except Exception as error:
            found[package] = f"unavailable ({type(error).__name__})"
    return found


def write_report(out: Path, result: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gdn_kernels.json").write_text(json.dumps(result, indent=2))
    errors = [f"- {r['impl']} w={r['w']} m={r['m']}: {r['error']}" for r in result["rows"] if "error" in r]
    sections = [
        "# GDN verify + commit, 30 layers of Qwen3.6-35B-A3B, batch 1",
        f"device: {result['device']}  \ndate: {result['date']}  \ncommand: `{result['command']}`  \n"
        f"versions: {json.dumps(result['versions'])}  \n"
        f"copy bandwidth (read + write): {result['copy_bandwidth_GBps']:.0f} GB/s"
        + (f" ({result['copy_bandwidth_source']})" if "copy_bandwidth_source" in result else ""),
        "## Median us per round (verify 30 layers + commit; ours: the commit folded into the next round's verify), "
        "bf16 inputs, fp32 states",
        timing_table(result["rows"]),
        *(["## Errors", "\n".join(errors)] if errors else []),
        "## Verification memory per request",
        "\n".join(f"- {k}: {v:,} B ({v / 1e9:.3f} GB)" for k, v in result["memory_bytes"].items()),
        "## Correctness vs float64 Eq. 1 (relative Frobenius error, worst over all w, m; every row in the JSON)",
        correctness_table(result["correctness"]),
    ]
    (out / "gdn_kernels.md").write_text("\n\n".join(sections) + "\n")


def report_from_log(log: Path, reference: Path | None, out: Path) -> int:
    """The report of a run that its time cap stopped before `write_report`: the correctness table
    (its worst errors per impl and dtype, one row each) and every timing row the log printed; the
    rows of the configurations it began but did not finish are recorded as not measured. The copy
    bandwidth comes from the log, or from `reference` (a report of the same machine), and says so."""
    text = log.read_text()
    correctness = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and cells[1] in ("float32", "bfloat16") and cells[-1] in ("yes", "NO", "no"):
            failed = re.match(r"error \(w=(\d+)\): (.*)", " | ".join(cells[2:-3]))
            if failed:  # `correctness_table`'s "error (w=N): message" (the message may hold a |)
                correctness.append(dict(impl=cells[0], dtype=cells[1], w=int(failed.group(1)), m="?",
                                        error=failed.group(2)))
            elif len(cells) == 6:
                correctness.append(dict(impl=cells[0], dtype=cells[1], w="all", m="all", o_err=float(cells[2]),
                                        state_err=float(cells[3]), passed=cells[5] == "yes"))
    timed = {}
    for impl, w, m, value in re.findall(r"^  (\w+)\s+w=\s*(\d+) m=\s*(\d+)  (.+)$", text, flags=re.M):
        row = dict(impl=impl, w=int(w), m=int(m), median_us=None)
        try:
            row["median_us"] = float(value)
        except ValueError:
            row["error"] = value
        timed[(impl, int(w), int(m))] = row
    found = re.search(r"copy bandwidth \(read \+ write\) ([\d.]+) GB/s", text)
    ref = json.loads(reference.read_text()) if reference else {}
    printed = re.search(r"^device (.+); versions (\{.*\})$", text, flags=re.M)
    run_command = re.search(r"^command (.+)$", text, flags=re.M)
    if printed:
        device, versions_found = printed.group(1), json.loads(printed.group(2))
    else:
        device = ref.get("device", "unknown")
        versions_found = dict(ref.get("versions", {}), source=f"the run of {ref.get('date')}; this one printed none")
    if found:
        bandwidth, source = float(found.group(1)) * 1e9, "measured in this run"
    elif ref:
        bandwidth = ref["copy_bandwidth_GBps"] * 1e9
        source = f"measured by the run of {ref.get('date')} on the same machine, not printed by this one"
    else:
        sys.exit("--from-log: the log has no copy bandwidth; name a report of the same machine with --bandwidth-from")
    impls = list(dict.fromkeys(impl for impl, _, _ in timed))
    rows = []
    for w, m in dict.fromkeys((w, m) for _, w, m in timed):
        for name in impls:
            rows.append(timed.get((name, w, m), dict(impl=name, w=w, m=m, median_us=None,
                                                       error="not measured: the run's time cap stopped it here")))
        rows.append(dict(impl="floor", w=w, m=m, median_us=round(floor_us(QWEN36, w, bandwidth), 2)))
    result = dict(device=device, date=f"{datetime.date.today().isoformat()} (from {log.name})",
                  command=f"{run_command.group(1) if run_command else 'not printed by the run'}, stopped before its "
                          f"report; report by --from-log", versions=versions_found,
                  copy_bandwidth_GBps=bandwidth / 1e9, copy_bandwidth_source=source,
                  memory_bytes=verification_memory(QWEN36), rows=rows, correctness=correctness,
                  tuning="hybridspec.kernels.gdn.tuning.SHIPPED")
    write_report(out, result)
    print(timing_table(rows))
    return 0


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for gdn_kernels.json/.md")
    parser.add_argument("--samples", type=int, default=30, help="timed samples per configuration")
    parser.add_argument("--replays", type=int, default=10, help="graph replays per sample")
    parser.add_argument("--quick", action="store_true", help="smoke run: w in {2, 16}, m = w, few samples")
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated subset of " + ",".join(IMPLS))
    parser.add_argument("--widths", help="comma-separated subset of w (default: " + ",".join(map(str, WIDTHS)) + ")")
    parser.add_argument("--tuning", type=Path,
                        help="gdn_tuning.json of bench/kernels/gdn_tuning.py: launch ours with its choice")
    parser.add_argument("--from-log", type=Path, help="write the report from the log of a run stopped before it "
                        "wrote one (no GPU): its printed rows, the unprinted ones as not measured")
    parser.add_argument("--bandwidth-from", type=Path, help="with --from-log: the gdn_kernels.json whose copy "
                        "bandwidth, device and versions to take (older logs have none of them)")
    parser.add_argument("--no-sglang-pdl", action="store_true",
                        help="launch SGLang's kernels without programmatic dependent launch (SGLang uses it on SM90+)")
    return parser.parse_args(argv)


def tuning_from_sweep(chosen: dict):
    """The shipped launch table with the per-length verify choice of bench/kernels/gdn_tuning.py
    and its one commit choice at every window length (the sweep times the commit alone)."""
    from hybridspec.kernels.gdn import triton as gdn

    def build(cls, row: dict):
        return cls(**{f.name: row[f.name] for f in dataclasses.fields(cls) if f.name in row})

    verify = {int(T): build(gdn.VerifyTuning, t) for T, t in chosen["verify"].items()}
    commit = {T: build(gdn.CommitTuning, chosen["commit"]) for T in gdn.SHIPPED.commit} if chosen.get("commit") else {}
    tuning = gdn.SHIPPED.replace(verify=verify, commit=commit)
    print(f"tuning: verify {dict(tuning.verify)}, commit {dict(tuning.commit)}", flush=True)
    return tuning


def configurations(quick: bool, widths: str | None = None) -> list[tuple[int, int]]:
    if quick:
        return [(2, 2), (16, 16)]
    chosen = WIDTHS if widths is None else tuple(int(w) for w in widths.split(","))
    if unknown := sorted(set(chosen) - set(WIDTHS)):
        sys.exit(f"--widths: {unknown} not among {list(WIDTHS)}")
    return [(w, m) for w in chosen for m in dict.fromkeys((w, math.ceil(w / 2)))]


def require_gpu() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench/kernels/gdn_kernels.py measures GPU kernels and needs CUDA; no CUDA device here, "
                 "nothing was run.")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("TRITON_INTERPRET is set: the kernels would be interpreted, not timed. Unset it.")


@torch.no_grad()
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.from_log:
        return report_from_log(args.from_log, args.bandwidth_from, args.out)
    require_gpu()
    impls = [name for name in args.impls.split(",") if name]
    unknown = [name for name in impls if name not in IMPLS]
    if unknown or "hybridspec" not in impls:
        sys.exit(f"--impls must include hybridspec and name only {list(IMPLS)}; got {impls}")
    prepare_baselines(torch.cuda.get_device_capability(), pdl=not args.no_sglang_pdl)
    makers = {name: IMPLS[name] for name in impls}
    if args.tuning:
        tuning = tuning_from_sweep(json.loads(args.tuning.read_text())["chosen"])
        makers.update({name: functools.partial(IMPLS[name], tuning=tuning) for name in impls
                       if name.startswith("hybridspec")})
    samples, replays = (5, 3) if args.quick else (args.samples, args.replays)
    configs = configurations(args.quick, args.widths)

    command = " ".join([Path(sys.executable).name, *sys.argv])
    print(f"command {command}\ndevice {torch.cuda.get_device_name()}; versions {json.dumps(versions())}", flush=True)
    print("Phase 1: correctness against float64 Eq. 1 (all 30 layers)", flush=True)
    correctness = check_correctness(QWEN36, configs, makers, "cuda")
    print(correctness_table(correctness), flush=True)
    ours = [r for r in correctness if r["impl"] == "hybridspec"]
    if not all(r.get("passed") for r in ours):
        print("hybridspec FAILED the correctness check: no timing run.", file=sys.stderr)
        return 1

    print(f"\nPhase 2: timing ({samples} samples x {replays} replays x {ROTATIONS} rounds)", flush=True)
    bandwidth = copy_bandwidth(samples=20)
    print(f"  copy bandwidth (read + write) {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows = run_timing(QWEN36, configs, makers, samples, replays, bandwidth)
    result = dict(
        device=torch.cuda.get_device_name(), date=datetime.datetime.now().isoformat(timespec="seconds"),
        command=command, versions=versions(),
        copy_bandwidth_GBps=bandwidth / 1e9, memory_bytes=verification_memory(QWEN36), rows=rows,
        correctness=correctness,
        tuning=(json.loads(args.tuning.read_text())["chosen"] if args.tuning
                else "hybridspec.kernels.gdn.tuning.SHIPPED"),
    )
    write_report(args.out, result)
    print("\n" + timing_table(rows))
    print(f"\nwrote {args.out / 'gdn_kernels.json'} and {args.out / 'gdn_kernels.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
