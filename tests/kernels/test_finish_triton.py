"""`kernels/finish`: the round's end in one launch against its PyTorch reference, every output
equal: greedy acceptance at every verified length with every accepted count, the sampled rule's
given (A, x_new), Stage 0's Layer-0 rows of the whole block or of the verified tokens only."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.finish import reference  # noqa: E402
from hybridspec.kernels.finish.triton import finish_round  # noqa: E402

D = 15


def _case(w: int, accepted: int, U: int, K: int, seed: int):
    """Inputs where the first `accepted` drafts equal the target's argmax and the next differs."""
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, 1000, (D,), generator=gen)
    y = torch.randint(0, 1000, (w,), generator=gen)
    y[:accepted] = drafts[:accepted]
    if accepted < w - 1:
        y[accepted] = drafts[accepted] + 1
    lengths = tuple(torch.tensor([v]) for v in (max(2, w - 1), w, w))
    return dict(drafts=drafts, w=w, y=y, lengths=lengths, confidence=torch.rand(D, generator=gen),
                entropy=torch.rand(D, generator=gen), layer0=torch.randint(0, 256, (U, K), generator=gen))


def _outputs(K: int, remaining: int):
    return dict(report=torch.full((4 + (D + 1) + 3 * D + (D + 1) * K,), 7.0), anchor=torch.zeros(1, dtype=torch.long),
                remaining=torch.tensor([remaining]), m=torch.zeros(1, dtype=torch.long))


@pytest.mark.parametrize("K", (2, 8, 10))
@pytest.mark.parametrize("w", (2, 3, 5, 9, 16))
def test_greedy_end_of_round_equals_the_reference(w, K):
    for accepted in range(w):
        for U in (w, D + 1):
            case = _case(w, accepted, U, K, seed=100 * w + accepted)
            want, got = _outputs(K, 40), _outputs(K, 40)
            reference.finish_round(accepted=None, x_new=None, **case, **want)
            finish_round(accepted=None, x_new=None, **case, **got)
            for name in want:
                assert torch.equal(got[name], want[name]), (name, w, accepted, U)
            assert int(got["m"]) == accepted + 1
            assert int(got["anchor"]) == int(case["y"][accepted])
            assert int(got["remaining"]) == 40 - accepted - 1


@pytest.mark.parametrize("w", (2, 7, 16))
def test_sampled_end_of_round_takes_the_given_acceptance(w):
    for accepted in (0, w // 2, w - 1):
        case = _case(w, 0, D + 1, 8, seed=w + accepted)
        case.pop("y")
        given = dict(accepted=torch.tensor([accepted]), x_new=torch.tensor([4321]))
        want, got = _outputs(8, 20), _outputs(8, 20)
        reference.finish_round(y=None, **given, **case, **want)
        finish_round(y=None, **given, **case, **got)
        for name in want:
            assert torch.equal(got[name], want[name]), (name, w, accepted)
        assert int(got["anchor"]) == 4321


def test_bad_arguments_are_named():
    case = _case(4, 1, 4, 8, seed=0)
    with pytest.raises(ValueError, match="y \\(greedy\\) or accepted"):
        finish_round(accepted=torch.tensor([1]), x_new=None, **case, **_outputs(8, 9))
    case["drafts"] = case["drafts"].int()
    with pytest.raises(ValueError, match="drafts must be contiguous long"):
        finish_round(accepted=None, x_new=None, **case, **_outputs(8, 9))
    case = _case(4, 1, 4, 8, seed=0)
    with pytest.raises(ValueError, match="report must be contiguous fp32"):
        finish_round(accepted=None, x_new=None, **case, **_outputs(10, 9))
