"""The one-launch selector compiled on the GPU: the torch form's lengths on random drafts, no host
read, and a CUDA-graph replay on new drafts equal to an eager call."""

import pytest
import torch

from hybridspec.runtime.policies import HybridSpecPolicy
from tests.runtime.helpers import policy_parameters

pytestmark = pytest.mark.gpu


def test_selector_on_the_gpu_in_a_graph():
    params = policy_parameters(rho=400.0)
    policy = HybridSpecPolicy("hybridspec", params.draft_len, params).to("cuda")
    D, W = params.draft_len, params.draft_len + 1
    g = torch.Generator(device="cuda").manual_seed(0)
    conf, ent = torch.rand(D, device="cuda", generator=g), torch.rand(D, device="cuda", generator=g)
    layer0 = torch.randint(0, 64, (W, 8), device="cuda", generator=g)
    w_rem = torch.tensor([W], device="cuda")
    out = tuple(torch.zeros(1, dtype=torch.long, device="cuda") for _ in range(3))
    torch.cuda.set_sync_debug_mode("error")
    try:
        policy.select_fused(conf, ent, w_rem, out, layer0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    w0, p_hat = policy.nominal_length(conf, ent)
    assert int(out[0]) == int(w0)
    assert int(out[1]) == int(policy.corrected_length(w0, p_hat, layer0, w_rem[0], 64))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        policy.select_fused(conf, ent, w_rem, out, layer0)
    for seed in range(5):
        g.manual_seed(seed + 1)
        conf.copy_(torch.rand(D, device="cuda", generator=g) ** (seed + 1))
        ent.copy_(torch.rand(D, device="cuda", generator=g))
        graph.replay()
        want = tuple(torch.zeros(1, dtype=torch.long, device="cuda") for _ in range(3))
        policy.select_fused(conf, ent, w_rem, want, layer0)
        assert [int(t) for t in out] == [int(t) for t in want]
