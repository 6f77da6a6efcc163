"""The GDN layer's conv, gated verification and gated norm in one launch (`gdn_mixer`) compiled on
the GPU at the 35B shapes (16 key heads, 32 value heads of 128, bf16, the previous round pending):
against the three launches it replaces (the normed o within one bf16 ulp, the conv inputs and raw
keys exact, the factors and folded state to fp32 rounding), at the shipped recurrent program shapes;
replays in a CUDA graph with new inputs, and leaves every head counter at zero."""

import pytest
import torch

from hybridspec.kernels.gdn import reference
from hybridspec.kernels.gdn import triton as gdn_triton
from hybridspec.kernels.gdn.mixer import _counters
from hybridspec.kernels.norm.triton import gated_rms_norm
from tests.kernels.gdn_cases import MIXER_OUTPUTS, fresh_mixer_buffers, mixer_heads, mixer_inputs, with_pending
from tests.tolerance import assert_close

pytestmark = pytest.mark.gpu

SHAPE = dict(HK=16, HV=32, dk=128, dv=128)


def _cuda(inputs: dict) -> dict:
    out = {n: v.cuda() if isinstance(v, torch.Tensor) else v for n, v in inputs.items()}
    if "pending" in inputs:
        out["pending"] = tuple(t.cuda() for t in inputs["pending"])
    return out


def _three(inputs: dict) -> torch.Tensor:
    q, k, v = reference.split_heads(gdn_triton.causal_conv_silu(inputs["x"], inputs["conv_state"],
                                                                inputs["conv_weight"], x_out=inputs["conv_out"]),
                                    **mixer_heads(inputs))
    o, _, _ = gdn_triton.gdn_verify_gated(q, k, v, inputs["a"], inputs["b"], inputs["A_log"], inputs["dt_bias"],
                                          inputs["state"], inputs["scale"], z_out=inputs["z_out"],
                                          g_out=inputs["g_out"], k_out=inputs["k_out"],
                                          pending=inputs.get("pending"), raw_keys=True)
    return gated_rms_norm(o, inputs["gate"], inputs["norm_weight"], inputs["norm_eps"])


@pytest.mark.parametrize("T", [1, 2, 3, 4])
def test_equals_the_three_launches_on_the_gpu(T):
    inputs = _cuda(with_pending(mixer_inputs(900 + T, T, torch.bfloat16, **SHAPE), 4, seed=950 + T))
    three, one = fresh_mixer_buffers(inputs), fresh_mixer_buffers(inputs)

    want = _three(three)
    got = gdn_triton.gdn_mixer(**one)

    assert_close("o (normed, gated; bf16)", want, got, 2**-7)
    assert (got.float() - want.float()).abs().max() <= 2**-7 * want.float().abs().max()
    for name in ("conv_out", "k_out"):
        assert torch.equal(three[name], one[name]), name
    assert_close("z_out", three["z_out"], one["z_out"], 1e-6)
    assert_close("g_out", three["g_out"], one["g_out"], 1e-6)
    assert_close("state", three["state"], one["state"], 1e-6)
    torch.cuda.synchronize()
    assert not _counters(got.device).any()


def test_replays_in_a_cuda_graph():
    inputs = _cuda(mixer_inputs(990, 1, torch.bfloat16, **SHAPE))
    state0 = inputs["state"].clone()
    gdn_triton.gdn_mixer(**fresh_mixer_buffers(inputs))  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o = gdn_triton.gdn_mixer(**inputs)
    for seed in (991, 992):
        new = _cuda(mixer_inputs(seed, 1, torch.bfloat16, **SHAPE))
        for name in ("x", "a", "b", "gate"):
            inputs[name].copy_(new[name])
        inputs["state"].copy_(state0)
        graph.replay()
        eager = fresh_mixer_buffers(dict(inputs, state=state0))
        assert torch.equal(o, gdn_triton.gdn_mixer(**eager)), seed
        for name in MIXER_OUTPUTS:
            assert torch.equal(inputs[name], eager[name]), (seed, name)
    torch.cuda.synchronize()
    assert not _counters(o.device).any()
