"""The implementations bench/kernels/gdn_kernels.py times: HybridSpec's Triton kernels (as the
runtime runs them, and with the commit as a launch of its own), SGLang's GDN kernels and fla's
chunked kernel, loaded from .baselines/site. Each takes one `Problem` and (w, m); __init__
allocates (untimed), round() is one verify + commit of all layers (graph-captured), outputs() and
committed() give o [L, w, HV, dv] and the committed state [L, HV, dv, dk] for the correctness check."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Callable

import torch
from gdn_problems import REPLAYSSM_RING, T_MAX, Problem
from torch import Tensor

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / ".baselines" / "site"
SGLANG_VERSION = "0.5.23"  # what shared/tools/gdn-baselines.sh extracts


class LayerCalls:
    """An implementation that calls its verify once per layer: round() leaves layer l's outputs
    [B = 1, w, HV, dv] in self.o[l]."""

    o: list[Tensor]

    def outputs(self) -> Tensor:  # [L, w, HV, dv]
        return torch.stack(self.o)[:, 0]


# ---------------------------------------------------------------------------------------------
# HybridSpec's kernels
# ---------------------------------------------------------------------------------------------


class HybridSpecCommit(LayerCalls):
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

    def committed(self) -> Tensor:  # [L, HV, dv, dk]
        return self.states[:, 0]


class HybridSpec(LayerCalls):
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

    def committed(self) -> Tensor:  # [L, HV, dv, dk]
        if self.pending:
            old, w = 1 - self.slot, self.w
            self.gdn.gdn_commit(self.states, self.z[old, :, :, :w], self.k[old, :, :, :w],
                                self.g_cum[old, :, :, :w], self.accepted, tuning=self.tuning)
            self.pending = False
        return self.states[:, 0]


# ---------------------------------------------------------------------------------------------
# SGLang's and fla's kernels
# ---------------------------------------------------------------------------------------------


def gating_verify_arguments(p: Problem, l: int, states: Tensor, slot: Tensor, cu_seqlens: Tensor) -> dict:
    """The arguments of SGLang's `fused_sigmoid_gating_delta_rule_update` that both of its verify
    modes (per-token states, raw-input ring) pass for layer l: gates from the raw a, b (softplus
    beta 1, threshold 20), q and k normalised in the kernel, S_0 read from states[l] at slot and
    not updated, one sequence of w tokens (cu_seqlens [0, w])."""
    return dict(
        A_log=p.A_log[l], a=p.a[l], dt_bias=p.dt_bias[l], softplus_beta=1.0,
        softplus_threshold=20.0, q=p.q[l], k=p.k[l], v=p.v[l], b=p.b[l],
        initial_state_source=states[l], initial_state_indices=slot, scale=p.scale,
        use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, is_kda=False, disable_state_update=True,
    )


class SGLangDefault(LayerCalls):
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
            **gating_verify_arguments(p, l, self.pool, self.slot, self.cu_seqlens),
            intermediate_states_buffer=self.steps[l], intermediate_state_indices=self.slot, cache_steps=self.w,
            retrieve_parent_token=None,
        ) for l in range(len(self.pool))]
        self.scatter.fused_mamba_state_scatter_with_mask(self.pool, self.steps, self.slot, self.last_step)

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


class SGLangReplayFold(LayerCalls):
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
            **gating_verify_arguments(p, l, self.temporal, self.slot, self.cu_seqlens),
            cache_ring=True, replayssm_rawv=self.raw_v[l], replayssm_rawk=self.raw_k[l], replayssm_g=self.g[l],
            replayssm_beta=self.beta[l],
        ) for l in range(len(self.temporal))]
        self.fold.commit_gdn_replayssm_fold_all_layers(
            checkpoint_state=self.temporal, rawv_cache=self.raw_v, rawk_cache=self.raw_k,
            g_cache=self.g, beta_cache=self.beta, ssm_state_indices=self.slot,
            accept_lens=self.accepted, max_cache_len=self.raw_v.shape[-2],
            num_k_heads=self.raw_k.shape[2], use_qk_l2norm_in_kernel=True, null_block_id=-1,
        )

    def committed(self) -> Tensor:
        return self.temporal[:, 0]


class FlaChunk(LayerCalls):
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
