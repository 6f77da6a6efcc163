"""Each backend's ops for the target's and the drafter's layers: `torch` (the kernels' PyTorch
references), `triton` (the Triton kernels, no host read in a pass), `triton-torch-gdn` (the
Triton kernels except the GDN layers', the paper's Table 3 ablation). The models call these by
module attribute, so a benchmark can swap one family (`bench/gpu_backend_probe.py`)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from functools import partial

import torch

from ..kernels.attention import reference as attention_reference
from ..kernels.gdn import reference as gdn_reference
from ..kernels.moe import reference as moe_reference
from ..kernels.norm import reference as norm_reference
from ..kernels.sampling import reference as sampling_reference
from .config import ConfigError

BACKENDS = ("torch", "triton", "triton-torch-gdn")


def triton_kernels(backend: str, module: str):
    """The Triton module `kernels.<module>` for the triton backend, None for the torch backend;
    `triton-torch-gdn` (the paper's Table 3 ablation) takes the Triton kernels except the GDN
    layers' (verification, fold, conv), which run their PyTorch reference. ConfigError for another
    name, or when triton cannot be imported."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r} ({', '.join(BACKENDS)})")
    if backend == "torch" or (backend == "triton-torch-gdn" and module.startswith("gdn.")):
        return None
    try:
        return importlib.import_module(f"hybridspec.kernels.{module}")
    except ImportError as exc:
        raise ConfigError(f"the triton backend needs triton ({exc})") from exc


def gdn_ops(backend: str, tuning=None) -> tuple[Callable, Callable]:
    """(verify, commit) implementations of the GDN kernels for a backend: verify is
    `gdn_verify_gated` (raw q, k, a, b in; norms and gates inside the kernel). The Triton kernels
    are specialised for verification lengths ≤ 16 (launched by `tuning`, the shipped table when
    None); longer prefill chunks use the reference."""
    gdn_triton = triton_kernels(backend, "gdn.triton")
    if gdn_triton is None:
        return gdn_reference.gdn_verify_gated, gdn_reference.gdn_commit
    launches = {} if tuning is None else {"tuning": tuning}

    def verify(q, k, v, a, b, A_log, dt_bias, state, scale, *, z_out=None, g_out=None, k_out=None, pending=None,
               raw_keys=False):
        if q.shape[1] > gdn_triton.MAX_TOKENS:
            return gdn_reference.gdn_verify_gated(q, k, v, a, b, A_log, dt_bias, state, scale, z_out=z_out,
                                                  g_out=g_out, k_out=k_out, pending=pending, raw_keys=raw_keys)
        return gdn_triton.gdn_verify_gated(q, k, v, a, b, A_log, dt_bias, state, scale, z_out=z_out, g_out=g_out,
                                           k_out=k_out, pending=pending, raw_keys=raw_keys, **launches)

    def commit(states, z, k, g_cum, accepted):
        impl = gdn_triton.gdn_commit if z.shape[2] <= gdn_triton.MAX_TOKENS else gdn_reference.gdn_commit
        impl(states, z, k, g_cum, accepted)

    return verify, commit


def gdn_conv_op(backend: str) -> Callable:
    """The GDN layer's causal conv + SiLU of a backend: the reference (copy, concatenation,
    convolution, SiLU, transpose) or one Triton launch."""
    gdn_triton = triton_kernels(backend, "gdn.triton")
    return gdn_reference.causal_conv_silu if gdn_triton is None else gdn_triton.causal_conv_silu


def router_ops(backend: str) -> tuple[Callable, Callable | None]:
    """(router, norm_router) of a backend: the router (logits, softmax, top-k), and the same with the
    MoE's input norm applied inside its launch, or None; the reference and None, or the Triton router
    (one launch per call of up to 16 tokens; the norm inside that launch for the calls its
    register-slice form takes)."""
    router = triton_kernels(backend, "moe.router")
    if router is None:
        return moe_reference.router, None
    return router.router, router.norm_router


def moe_experts_op(backend: str) -> Callable:
    """The experts' implementation of a backend (`kernels/moe`): the reference (one matmul pair per
    distinct expert, a host read per call) or the Triton kernels (no host read, any token count)."""
    experts = triton_kernels(backend, "moe.triton")
    return moe_reference.moe_experts if experts is None else experts.moe_experts


def attention_ops(backend: str) -> tuple[Callable, Callable]:
    """(gated attention, norm_rope_store) of a backend (`kernels/attention`): the references (SDPA
    with a boolean mask over the keys read; the q/k norms, RoPE and cache writes as separate ops) or
    the Triton kernels (split-KV attention reading the length on the device; one launch for the
    norms, RoPE and cache writes)."""
    attention = triton_kernels(backend, "attention.triton") or attention_reference
    return attention.gated_attention, attention.norm_rope_store


def drafter_ops(backend: str) -> dict[str, Callable | None]:
    """The drafter's ops for a backend (`DFlashDrafter.set_ops`): the PyTorch references (SDPA over the
    keys up to a host-known bound or a masked static span), or the Triton kernels: the plain RMS
    norms, the q/k norms with RoPE and cache writes in one launch, the split-KV block attention,
    which reads the context length on the device and only the live context, the draft tokens'
    statistics in one launch, and the products by `linear_op`'s."""
    attention = triton_kernels(backend, "attention.triton")
    norms = triton_kernels(backend, "norm.triton") or norm_reference
    statistics = triton_kernels(backend, "sampling.statistics")
    return dict(norm=norms.rms_norm, prepare=partial((attention or attention_reference).norm_rope_store, offset=False),
                block_attention=None if attention is None else attention.block_attention,
                statistics=sampling_reference.draft_statistics if statistics is None else statistics.draft_statistics,
                linear=linear_op(backend))


def linear_op(backend: str) -> Callable:
    """The product of the mixers' projections and the LM head for a backend: F.linear, or (triton)
    `kernels/linear`'s, which takes calls of one or two tokens (and fp32 calls of up to 16 tokens by a
    small weight) on its register-slice kernel and the rest on F.linear."""
    dense = triton_kernels(backend, "linear.triton")
    return torch.nn.functional.linear if dense is None else dense.linear


def norm_ops(backend: str) -> tuple[Callable, Callable]:
    """(offset_rms_norm, gated_rms_norm) of a backend (`kernels/norm`): the reference, or one Triton
    launch per norm with the residual add fused in."""
    norms = triton_kernels(backend, "norm.triton") or norm_reference
    return norms.offset_rms_norm, norms.gated_rms_norm


def device_resident(backend: str) -> bool:
    """Whether a backend's passes are free of host reads (the MoE loop of the torch backend reads
    the expert counts), so that the resident round and its CUDA graphs can run them."""
    return backend != "torch"
