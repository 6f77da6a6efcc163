"""The point-mass rule's kernels compiled on the GPU at the 35B preset's vocabulary (248,320,
bf16 logits): the reference's accepted count and token at every tested length, no host read, and
the same result from a CUDA graph replay on new logits."""

import pytest
import torch

from hybridspec.kernels.sampling import filtered, reference
from hybridspec.kernels.sampling import triton as sampling_triton

pytestmark = pytest.mark.gpu

V = 248_320


def _case(w: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(w, V, generator=gen) * 4).to(torch.bfloat16)
    likely = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)[:, 0]
    draft = torch.where(torch.rand(w, generator=gen) < 0.8, likely, torch.randint(0, V, (w,), generator=gen))
    args = (draft[: w - 1], logits, torch.tensor([1.0]), torch.tensor([seed]), torch.tensor([100 + seed]))
    return tuple(t.cuda() for t in args)


@pytest.mark.parametrize("w", [1, 4, 16])
def test_same_choice_as_the_reference_on_the_gpu(w):
    for seed in range(8):
        args = _case(w, seed)
        want = reference.point_mass_from_logits(*args)
        got = sampling_triton.point_mass_from_logits(*args)
        assert [int(t) for t in got] == [int(t) for t in want], (w, seed)


def test_no_host_read_and_graph_replay_on_new_logits():
    args = _case(16, 1)
    sampling_triton.point_mass_from_logits(*args)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = sampling_triton.point_mass_from_logits(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for seed in (2, 3):
        fresh = _case(16, seed)
        for buffer, value in zip(args, fresh):
            buffer.copy_(value)
        graph.replay()
        assert [int(t) for t in out] == [int(t) for t in reference.point_mass_from_logits(*fresh)]


@pytest.mark.parametrize("w", [1, 4, 16])
def test_filtered_same_choice_as_the_reference_on_the_gpu(w):
    for seed in range(8):
        draft, logits, inv_t, s, start = _case(w, seed)
        top_k = torch.tensor([(20, 1, 64, 40)[seed % 4]], device="cuda")
        top_p = torch.tensor([(0.95, 1.0, 0.8, 0.5)[seed % 4]], device="cuda")
        args = (draft, logits, inv_t * 1.6, top_k, top_p, s, start)
        want = reference.point_mass_filtered(*args)
        got = filtered.point_mass_filtered(*args)
        assert [int(t) for t in got] == [int(t) for t in want], (w, seed)


def test_filtered_graph_replays_read_the_parameters_from_the_device():
    """One captured top-k launch pair serves other top_k, top_p, seeds and positions written into
    its buffers between replays."""
    draft, logits, inv_t, seed, start = _case(8, 4)
    top_k, top_p = torch.tensor([20], device="cuda"), torch.tensor([0.95], device="cuda")
    args = (draft, logits, inv_t, top_k, top_p, seed, start)
    filtered.point_mass_filtered(*args)  # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = filtered.point_mass_filtered(*args)
    for k, p, s in ((20, 0.95, 1), (1, 1.0, 2), (64, 0.5, 3), (40, 0.8, 4)):
        fresh = _case(8, s)
        for buffer, value in zip((draft, logits, inv_t, seed, start), fresh):
            buffer.copy_(value)
        top_k.fill_(k)
        top_p.fill_(p)
        graph.replay()
        assert [int(t) for t in out] == [int(t) for t in reference.point_mass_filtered(*args)], (k, p, s)


def test_draft_statistics_on_the_gpu_and_in_a_graph():
    """The drafter's block statistics at the preset's vocabulary (15 rows of bf16 logits): the
    reference's confidences and entropies and the lowest id holding each row's maximum (bf16 logits
    tie), then the same from a graph replay on new logits."""
    from hybridspec.kernels.sampling.statistics import draft_statistics

    def check(out, logits):
        tokens, confidence, entropy = out
        _, want_confidence, want_entropy = reference.draft_statistics(logits)
        ids = torch.arange(V, device=logits.device)
        lowest = torch.where(logits == logits.max(-1, keepdim=True).values, ids, V).min(-1).values
        assert torch.equal(tokens, lowest)
        torch.testing.assert_close(confidence, want_confidence, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(entropy, want_entropy, rtol=1e-5, atol=1e-5)

    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(15, V, generator=gen) * 4).to(torch.bfloat16).cuda()
    check(draft_statistics(logits), logits)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = draft_statistics(logits)
    logits.copy_((torch.randn(15, V, generator=gen) * 4).to(torch.bfloat16))
    graph.replay()
    check(out, logits)
