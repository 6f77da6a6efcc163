"""The one-launch point-mass rule (under TRITON_INTERPRET=1 on CPU tensors) against the reference:
the same accepted count and token over random logits, temperatures, seeds, positions and drafts
that are kept, rejected and certain, at every verification length, with a vocabulary of several
blocks; its uniforms are the reference's (a race over equal logits is decided by the draws alone);
the last row excludes nothing and the residual excludes the rejected draft."""

from __future__ import annotations

import pytest
import torch

from hybridspec.kernels.sampling import reference

pytest.importorskip("triton")
from hybridspec.kernels.sampling import filtered  # noqa: E402
from hybridspec.kernels.sampling import triton as sampling_triton  # noqa: E402

V = 2 * sampling_triton.BLOCK_V + 37  # three blocks, the last one partial


def _case(w: int, seed: int, temperature: float):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(w, V, generator=gen) * 3).to(torch.bfloat16)
    probs = torch.softmax(logits.float() / temperature, -1)
    likely = torch.multinomial(probs, 1, generator=gen)[:, 0]  # often kept
    other = torch.randint(0, V, (w,), generator=gen)  # usually rejected
    draft = torch.where(torch.rand(w, generator=gen) < 0.7, likely, other)[: w - 1]
    return (draft, logits, torch.tensor([1.0 / temperature]), torch.tensor([seed * 7919 - 3]),
            torch.tensor([seed % 50]))


@pytest.mark.parametrize("w", [1, 2, 3, 5, 16])
def test_same_choice_as_the_reference(w):
    outcomes = set()
    for seed in range(12):
        args = _case(w, seed, temperature=(0.3, 1.0, 2.0)[seed % 3])
        want = reference.point_mass_from_logits(*args)
        got = sampling_triton.point_mass_from_logits(*args)
        assert [int(t) for t in got] == [int(t) for t in want], (w, seed)
        outcomes.add(int(want[0]))
    if w > 2:
        assert len(outcomes) > 1  # the cases reach more than one accepted count


def test_the_race_uses_the_reference_uniforms_and_excludes_only_the_rejected_draft():
    """Equal logits: the winner is the lane with the largest uniform's race value, decided by the
    keyed draws alone; a certain first draft is kept, and the residual of a rejected one never
    returns it."""
    logits = torch.zeros(3, V)
    for seed in range(4):
        args = (torch.tensor([5, 9]), logits, torch.tensor([1.0]), torch.tensor([seed]), torch.tensor([11]))
        assert [int(t) for t in sampling_triton.point_mass_from_logits(*args)] == \
            [int(t) for t in reference.point_mass_from_logits(*args)]
    certain = torch.full((2, V), -30.0)
    certain[0, 4] = 30.0  # row 0 puts all its mass on token 4
    certain[1, 6] = 30.0
    accepted, x_new = sampling_triton.point_mass_from_logits(torch.tensor([4]), certain, torch.tensor([1.0]),
                                                              torch.tensor([1]), torch.tensor([0]))
    assert (int(accepted), int(x_new)) == (1, 6)  # d1 kept; the last row excludes nothing
    for seed in range(4):
        accepted, x_new = sampling_triton.point_mass_from_logits(torch.tensor([6]), certain, torch.tensor([1.0]),
                                                                  torch.tensor([seed]), torch.tensor([0]))
        assert int(accepted) == 0 and int(x_new) != 6  # d1 has no mass: rejected and never re-emitted


def test_a_vocabulary_block_masked_to_minus_infinity():
    """A block of logits masked out entirely (constrained decoding) adds nothing to the row's
    softmax and never wins the race, in both kernels; a top-k buffer holding 0 acts as 1."""
    for seed in range(4):
        draft, logits, inv_t, s, start = _case(3, seed, temperature=1.0)
        logits = logits.float()
        logits[:, sampling_triton.BLOCK_V : 2 * sampling_triton.BLOCK_V] = float("-inf")
        args = (draft, logits, inv_t, s, start)
        assert [int(t) for t in sampling_triton.point_mass_from_logits(*args)] == \
            [int(t) for t in reference.point_mass_from_logits(*args)]
        top = (torch.tensor([7]), torch.tensor([0.9]))
        assert [int(t) for t in filtered.point_mass_filtered(draft, logits, inv_t, *top, s, start)] == \
            [int(t) for t in reference.point_mass_filtered(draft, logits, inv_t, *top, s, start)]
    zero, one = torch.tensor([0]), torch.tensor([1])
    args = (draft, logits, inv_t, zero, torch.tensor([1.0]), s, start)
    assert [int(t) for t in filtered.point_mass_filtered(*args)] == \
        [int(t) for t in reference.point_mass_filtered(draft, logits, inv_t, one, torch.tensor([1.0]), s, start)]


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="draft must be long"):
        sampling_triton.point_mass_from_logits(torch.zeros(2, dtype=torch.long), torch.zeros(2, V),
                                               torch.ones(1), torch.zeros(1, dtype=torch.long),
                                               torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("w", [1, 2, 5, 16])
def test_filtered_same_choice_as_the_reference(w):
    """top-k (1 … KMAX) and top-p cuts at several temperatures: the reference's accepted count and
    token, including drafts outside the kept set (probability zero: always rejected)."""
    outcomes = set()
    for seed in range(10 if w < 16 else 5):  # each seed a different top-k / top-p pair
        draft, logits, inv_t, s, start = _case(w, seed, temperature=(0.6, 1.0, 1.5)[seed % 3])
        top_k = torch.tensor([(1, 5, 20, filtered.KMAX, 40)[seed % 5]])
        top_p = torch.tensor([(1.0, 0.95, 0.5, 0.8)[seed % 4]])
        args = (draft, logits, inv_t, top_k, top_p, s, start)
        want = reference.point_mass_filtered(*args)
        got = filtered.point_mass_filtered(*args)
        assert [int(t) for t in got] == [int(t) for t in want], (w, seed, int(top_k), float(top_p))
        outcomes.add(int(want[0]))
    if w > 2:
        assert len(outcomes) > 1


def test_filtered_top_k_one_is_greedy_and_ties_go_to_the_lower_id():
    logits = torch.zeros(2, V)
    logits[:, 3] = logits[:, 4097] = 5.0  # a tie across blocks: the lower id is the top 1
    one = torch.tensor([1])
    for seed in range(3):
        args = (torch.tensor([4097]), logits, torch.tensor([1.0]), one, torch.tensor([1.0]), torch.tensor([seed]),
                torch.tensor([0]))
        assert [int(t) for t in filtered.point_mass_filtered(*args)] == [0, 3]  # d1 outside the top 1: rejected
        args = (torch.tensor([3]),) + args[1:]
        assert [int(t) for t in filtered.point_mass_filtered(*args)] == [1, 3]  # certain: kept, then the top 1
