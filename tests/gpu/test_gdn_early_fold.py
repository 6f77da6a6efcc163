"""The recurrent verification kernel's early fold (`VerifyTuning.early_fold`: the state rows, the
pending commit's factors and the gate parameters read, and the fold done, before the PDL wait) on
the GPU at the 35B shapes, launched right after the conv kernel whose q, k, v it reads after the
wait, as the layer runs them: three rounds, each folding the previous round's commit, give bitwise
the shipped row's outputs, factors and states, eagerly and replayed in a CUDA graph."""

import dataclasses

import pytest
import torch

from hybridspec.kernels.gdn import triton as gdn_triton
from hybridspec.kernels.gdn.conv import causal_conv_silu
from hybridspec.kernels.gdn.tuning import RECURRENT

pytestmark = pytest.mark.gpu

HK, HV, DK, DV, ROUNDS = 16, 32, 128, 128, 3  # the 35B preset's GDN heads


def _inputs(T: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(T)
    conv_dim = 2 * HK * DK + HV * DV

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (scale * torch.randn(*shape, generator=g, device="cuda")).to(dtype)

    return dict(x=[randn(1, T, conv_dim) for _ in range(ROUNDS)], conv_state=randn(1, conv_dim, 3),
                conv_weight=randn(conv_dim, 1, 4, scale=0.5), a=[randn(1, T, HV) for _ in range(ROUNDS)],
                b=[randn(1, T, HV) for _ in range(ROUNDS)], A_log=randn(HV, scale=0.5, dtype=torch.float32),
                dt_bias=randn(HV, scale=0.5, dtype=torch.float32),
                state=randn(1, HV, DV, DK, scale=0.1, dtype=torch.float32),
                accepted=[torch.tensor([m], device="cuda") for m in range(1, ROUNDS + 1)])


def _rounds(inputs: dict, row) -> list[torch.Tensor]:
    """Conv then verification per round, the previous round's factors pending; every output."""
    T = inputs["x"][0].shape[1]
    tuning = gdn_triton.SHIPPED.replace(verify={t: row for t in range(1, 17)})
    state, pending, outs = inputs["state"].clone(), None, []
    for r in range(ROUNDS):
        mixed = causal_conv_silu(inputs["x"][r], inputs["conv_state"], inputs["conv_weight"])
        q, k, v = mixed.split((HK * DK, HK * DK, HV * DV), dim=-1)
        q, k, v = q.view(1, T, HK, DK), k.view(1, T, HK, DK), v.view(1, T, HV, DV)
        z = torch.empty(1, T, HV, DV, device="cuda")
        g_cum = torch.empty(1, T, HV, device="cuda")
        k_out = torch.empty(1, T, HK, DK, device="cuda", dtype=torch.bfloat16)
        o, _, _ = gdn_triton.gdn_verify_gated(q, k, v, inputs["a"][r], inputs["b"][r], inputs["A_log"],
                                              inputs["dt_bias"], state, DK**-0.5, z_out=z, g_out=g_cum, k_out=k_out,
                                              pending=pending, raw_keys=True, tuning=tuning)
        pending = (z, k_out, g_cum, inputs["accepted"][min(r, T - 1)])
        outs += [o, z, g_cum, k_out]
    return outs + [state]


@pytest.mark.parametrize("T", [1, 2, 4])
def test_early_fold_after_the_conv_gives_the_same_bits(T):
    inputs = _inputs(T)
    early = dataclasses.replace(RECURRENT, block_v=4 if T > 2 else 8, early_fold=True)
    want = _rounds(inputs, dataclasses.replace(early, early_fold=False))
    for a, b in zip(want, _rounds(inputs, early)):
        assert torch.equal(a, b)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _rounds(inputs, early)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = _rounds(inputs, early)
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(want, replayed):
            assert torch.equal(a, b)
