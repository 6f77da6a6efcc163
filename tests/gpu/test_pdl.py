"""Programmatic dependent launch changes no result: a chain of the round's Triton kernels (norm,
router, experts, norm, q/k norms with RoPE and cache writes, attention, gated norm, projection),
each reading its predecessor's output, and a GDN layer's launches over consecutive passes (whose
verification reads its state before its wait), give bitwise the same outputs launched with and
without it, eagerly and replayed in a CUDA graph."""

import dataclasses

import pytest
import torch

from hybridspec.kernels import pdl
from hybridspec.kernels.attention import triton as attention_triton
from hybridspec.kernels.gdn import conv as gdn_conv
from hybridspec.kernels.gdn import triton as gdn_triton
from hybridspec.kernels.gdn import tuning as gdn_tuning
from hybridspec.kernels.linear import triton as linear_triton
from hybridspec.kernels.moe import router as moe_router
from hybridspec.kernels.moe import triton as moe_triton
from hybridspec.kernels.norm import triton as norm_triton
from tests.kernels.moe_cases import moe_inputs
from tests.kernels.test_attention_triton import _prepare_case

pytestmark = pytest.mark.gpu

H, D = 2048, 256  # hidden; 8 query heads of 256 read the hidden row


def chain(x, residual, norm_w, router_w, moe, prep, proj_w):
    """The kernels in round order, each on its predecessor's output; every output, and the cache."""
    n = x.shape[0]
    h, s = norm_triton.offset_rms_norm(x, norm_w, 1e-6, residual)
    ids, weights = moe_router.router(h, router_w, 8, True, h.dtype)
    y = moe_triton.moe_experts(h, ids, weights, moe["gate_up"], moe["down"], moe["shared"])
    h2, s2 = norm_triton.offset_rms_norm(y, norm_w, 1e-6, s)
    q_src = h2.view(1, n, H // D, D)
    k, v, q_weight, k_weight, eps, cos, sin, key, value, position = prep
    q = attention_triton.norm_rope_store(q_src, k, v, q_weight, k_weight, eps, cos, sin, key, value, position)
    out = attention_triton.gated_attention(q, q_src, key, value, position)
    gated = norm_triton.gated_rms_norm(out.view(1, n, H // D, D), q_src, q_weight.to(q.dtype), 1e-6)
    projected = linear_triton.linear(gated.reshape(n, H), proj_w)  # the register-slice kernel at n <= 2
    return [s, ids, weights, y, s2, q, out, gated, projected, key.clone(), value.clone()]


def inputs(n, device):
    gen = torch.Generator().manual_seed(n)
    x, residual = (torch.randn(n, H, generator=gen).to(torch.bfloat16).to(device) for _ in range(2))
    norm_w = (torch.randn(H, generator=gen) * 0.1).to(device)
    router_w = (torch.randn(256, H, generator=gen) / H**0.5).to(torch.bfloat16).to(device)
    moe = {k: (type(v)(*(t.to(device) for t in v)) if isinstance(v, tuple) else v.to(device))
           for k, v in moe_inputs(n, 8, 256, H, 512, 512, dtype=torch.bfloat16, seed=n).items()}
    prep = [a.to(device) if isinstance(a, torch.Tensor) else a
            for a in _prepare_case(1, n, H // D, 2, D, 64, 1100, 500, torch.bfloat16, seed=n)[1:]]
    prep[7].zero_()  # the key and value caches: zero, not the NaN the kernel tests fill them with
    prep[8].zero_()
    proj_w = (torch.randn(H, H, generator=gen) / H**0.5).to(torch.bfloat16).to(device)
    return x, residual, norm_w, router_w, moe, prep, proj_w


@pytest.mark.parametrize("n", [1, 2, 4, 16])
def test_same_outputs_with_and_without_pdl(n, monkeypatch):
    """The chain as one-token `ar` and verification passes run it, with and without PDL, in a stream
    and in a graph: the same bits."""
    args = inputs(n, "cuda")
    monkeypatch.setattr(pdl, "ENABLED", False)
    want = chain(*args)
    monkeypatch.setattr(pdl, "ENABLED", True)
    assert pdl.options(args[0]) == {"USE_GDC": True, "launch_pdl": True}  # the H200: capability 9
    for a, b in zip(want, chain(*args)):
        assert torch.equal(a, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        chain(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = chain(*args)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(want, replayed):
        assert torch.equal(a, b)


HK, HV, DK, DV = 16, 32, 128, 128  # the 35B preset's GDN heads
CONV = 2 * HK * DK + HV * DV


def gdn_passes(passes, weights, buffers, verify_tuning):
    """One GDN layer's launches (conv + SiLU, verification with the previous pass's factors folded
    in, gated norm) for consecutive passes over one state, the factors in two alternating slots as
    the cache keeps them: every output, and the state. The verification reads its state and the
    pending factors before its PDL wait (the shipped tuning) or after it."""
    conv_w, A_log, dt_bias, norm_w = weights
    conv_state, state, z_slots, k_slots, g_slots, accepted = buffers
    out = []
    for p, (x, a, b, gate) in enumerate(passes):
        T = x.shape[1]
        y = gdn_conv.causal_conv_silu(x, conv_state, conv_w)
        q, k, v = y.split((HK * DK, HK * DK, HV * DV), dim=-1)
        new, old = p % 2, 1 - p % 2
        pending = None if p == 0 else (z_slots[old, :, :T], k_slots[old, :, :T], g_slots[old, :, :T], accepted)
        o, _, _ = gdn_triton.gdn_verify_gated(q.reshape(1, T, HK, DK), k.reshape(1, T, HK, DK), v.reshape(1, T, HV, DV),
                                              a, b, A_log, dt_bias, state, DK**-0.5, z_out=z_slots[new, :, :T],
                                              g_out=g_slots[new, :, :T], k_out=k_slots[new, :, :T], pending=pending,
                                              raw_keys=True, tuning=verify_tuning)
        out += [y, o, norm_triton.gated_rms_norm(o, gate, norm_w, 1e-6)]
    return out + [state.clone(), z_slots.clone(), k_slots.clone(), g_slots.clone()]


def gdn_case(T, device):
    gen = torch.Generator().manual_seed(200 + T)

    def bf16(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(torch.bfloat16).to(device)

    passes = [(bf16(1, T, CONV), bf16(1, T, HV), bf16(1, T, HV), bf16(1, T, HV, DV)) for _ in range(3)]
    weights = (bf16(CONV, 1, 4, scale=0.5), (0.5 * torch.randn(HV, generator=gen)).to(device),
               torch.randn(HV, generator=gen).to(device),
               (1 + 0.1 * torch.randn(DV, generator=gen)).to(torch.bfloat16).to(device))  # the gate's dtype
    state = (0.1 * torch.randn(1, HV, DV, DK, generator=gen)).to(device)
    buffers = (bf16(1, CONV, 3), state, torch.zeros(2, 1, T, HV, DV, device=device),
               torch.zeros(2, 1, T, HK, DK, device=device, dtype=torch.bfloat16),
               torch.zeros(2, 1, T, HV, device=device), torch.full((1,), max(1, T - 1), device=device))
    return passes, weights, buffers


@pytest.mark.parametrize("T", [1, 2, 4, 8, 16])
def test_gdn_state_read_before_the_wait_changes_nothing(T, monkeypatch):
    """Three passes of a GDN layer, each verification folding the previous pass's factors into the
    state it reads before its wait: the same bits as without PDL (the shipped tuning table with PDL
    off and every read after the wait), eagerly and replayed in a CUDA graph."""
    passes, weights, initial = gdn_case(T, "cuda")
    plain = gdn_tuning.SHIPPED.replace(verify={t: dataclasses.replace(v, pdl=False, early_state=False)
                                               for t, v in gdn_tuning.SHIPPED.verify.items()})
    monkeypatch.setattr(pdl, "ENABLED", False)
    want = gdn_passes(passes, weights, [b.clone() for b in initial], plain)
    monkeypatch.setattr(pdl, "ENABLED", True)
    assert gdn_tuning.SHIPPED.verify[T].early_state and gdn_tuning.SHIPPED.verify[T].pdl
    for a, b in zip(want, gdn_passes(passes, weights, [b.clone() for b in initial], gdn_tuning.SHIPPED)):
        assert torch.equal(a, b)
    buffers = [b.clone() for b in initial]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = gdn_passes(passes, weights, buffers, gdn_tuning.SHIPPED)
    for buffer, start in zip(buffers, initial):
        buffer.copy_(start)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(want, replayed):
        assert torch.equal(a, b)
