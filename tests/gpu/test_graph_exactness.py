"""A verification pass captured as a CUDA graph computes what the same pass computes eagerly, bit
for bit, at every layer (bf16 and fp32, shipped Triton kernels): the graph path's tokens can only
equal the eager path's if this holds. A difference names the first layer and its type."""

import pytest
import torch

from hybridspec.runtime.engine import Engine
from hybridspec.runtime.session import open_session
from tests.runtime.helpers import pass_outputs

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("model,dtype", [("random-tiny", "bfloat16"), (None, "float32")])
@pytest.mark.parametrize("w", [1, 2, 8, 16])
def test_graph_pass_equals_eager_pass_at_every_layer(model, dtype, w):
    session = open_session(model, "random" if model else None, device="cuda", dtype=dtype, backend="triton",
                           max_context=256)
    target = session.target
    taps, target.feature_layers = target.feature_layers, tuple(range(len(target.layers)))
    try:
        engine = Engine(target, None, max_context=200, resident=False)
        cache = engine.cache
        cache.reset()
        gen = torch.Generator().manual_seed(w)
        prompt = torch.randint(0, target.cfg.vocab_size, (1, 120), generator=gen).cuda()
        target.prefill(prompt, cache)
        target.enter_static(cache, 16)  # a commit of nothing: every pass starts from the same state
        block = torch.randint(0, target.cfg.vocab_size, (1, w), generator=gen).cuda()
        eager = pass_outputs(target, cache, block, graph=False)
        graph = pass_outputs(target, cache, block, graph=True)
    finally:
        target.feature_layers = taps
    L, H = len(target.layers), target.cfg.hidden_size
    fe, fg = eager[0].view(w, L, H), graph[0].view(w, L, H)
    differ = [i for i in range(L) if not torch.equal(fe[:, i], fg[:, i])]
    assert not differ, (f"layer {differ[0]} ({target.cfg.layer_types[differ[0]]}) differs first, "
                        f"{len(differ)} of {L} layers differ")
    assert torch.equal(eager[1], graph[1])
