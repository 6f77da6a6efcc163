"""The previous round's commit folded into the next verification (`gdn_verify_gated(pending=...)`),
under TRITON_INTERPRET=1, against float64 steps over the accepted tokens of both rounds: the split
and recurrent kernels, raw or normalised key factors, bf16 or fp32, the runtime's round buffers."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import re

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from tests.kernels.gdn_cases import BF16_ROUNDING, FP32_RATIO, PIECES_RATIO, SHAPES  # noqa: E402
from tests.kernels.gdn_cases import first_round, second_round, two_rounds_oracle, verify_table  # noqa: E402
from tests.kernels.test_gdn_reference import gated_steps, raw_inputs  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402

FOLD_CASES = [("split", T1, T2) for T1, T2 in ((3, 5), (16, 16), (16, 1))]
FOLD_CASES += [("recurrent-4x1", 2, 2), ("recurrent-8x1", 16, 4)]
FOLD_CASES += [("recurrent-8x1", 5, 3), ("split", 20, 6)]  # 20: committed by the reference
FOLD_CASES += [("split-late-keys", 3, 5), ("split-state-after-wait", 2, 7)]


@pytest.mark.parametrize(("variant", "T1", "T2"), FOLD_CASES)
def test_verify_folds_the_pending_commit(variant, T1, T2):
    """A round with the previous round's factors pending equals running that round's accepted
    tokens (m = T1 in one sequence, 1 in the other) and then this round's, and leaves the committed
    state in place; the factors of this round land in their buffers as without a pending commit.
    Odd first lengths take the factors with raw keys (`raw_keys`), even ones the normalised keys."""
    first, (z1, k1, g1) = first_round(T1, 500 + T1 + T2, raw_keys=T1 % 2 == 1, **SHAPES["grouped"])
    second = second_round(first, T2, 600 + T1 + T2, **SHAPES["grouped"])
    accepted = [T1, 1]
    o_ref, s_ref = two_rounds_oracle(first, second, accepted)
    state = first["state"].clone()
    o_alone, z_alone, _ = reference.gdn_verify_gated(**dict(second, state=s_ref.float()))

    o, z, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state), pending=(z1, k1, g1, torch.tensor(accepted)),
                                          tuning=verify_table(variant))

    assert_close("committed state, in place", s_ref, state, FP32_RATIO)
    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z (as verified from the committed state)", z_alone, z, FP32_RATIO)


@pytest.mark.parametrize(("variant", "raw_keys"), [("split", False), ("split", True), ("split-late-keys", True),
                                                   ("recurrent-4x1", True)])
def test_verify_folds_bf16_pending_commit(variant, raw_keys):
    """bf16 projections, as the model has them: the split kernel's fold takes two bf16 pieces of
    the weighted z and k exact in bf16 (raw keys: two products) or in two pieces as well (three),
    so the state is carried to the pieces' precision."""
    T1, T2 = 16, 8
    first, (z1, k1, g1) = first_round(T1, 650, dtype=torch.bfloat16, raw_keys=raw_keys, **SHAPES["grouped"])
    assert k1.dtype == (torch.bfloat16 if raw_keys else torch.float32)
    second = second_round(first, T2, 660, dtype=torch.bfloat16, **SHAPES["grouped"])
    accepted = [T1 // 2, T1]
    o_ref, s_ref = two_rounds_oracle(first, second, accepted)
    state = first["state"].clone()

    o, _, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state), pending=(z1, k1, g1, torch.tensor(accepted)),
                                          tuning=verify_table(variant))

    assert_close("committed state, in place", s_ref, state, PIECES_RATIO if variant.startswith("split") else FP32_RATIO)
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)


def test_verify_names_a_bad_pending_commit():
    first, (z1, k1, g1) = first_round(4, 700, **SHAPES["grouped"])
    second = second_round(first, 3, 701, **SHAPES["grouped"])
    m = torch.tensor([4, 2])
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: pending commit: z has shape")):
        gdn_triton.gdn_verify_gated(**second, pending=(z1[:, :, :1], k1, g1, m))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: pending commit: accepted = [5, 2]")):
        gdn_triton.gdn_verify_gated(**second, pending=(z1, k1, g1, torch.tensor([5, 2])))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: pending g_cum has dtype torch.bfloat16")):
        gdn_triton.gdn_verify_gated(**second, pending=(z1, k1, g1.bfloat16(), m))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: pending must be (z, k, g_cum, accepted)")):
        gdn_triton.gdn_verify_gated(**second, pending=(z1, k1, g1))


def test_reference_folds_the_pending_commit():
    """The reference's pending commit (the torch backend's path) against the same oracle."""
    first, (z1, k1, g1) = first_round(6, 710, **SHAPES["ungrouped"])
    second = second_round(first, 4, 711, **SHAPES["ungrouped"])
    o_ref, s_ref = two_rounds_oracle(first, second, [2, 6])
    state = first["state"].clone()

    o, _, _ = reference.gdn_verify_gated(**dict(second, state=state), pending=(z1, k1, g1, torch.tensor([2, 6])))

    assert_close("committed state, in place", s_ref, state, FP32_RATIO)
    assert_close("o", o_ref, o, FP32_RATIO)


RAW_ROUND_CASES = [("split", 16, 8, torch.bfloat16), ("split-late-keys", 9, 12, torch.float32),
                   ("recurrent-4x1", 4, 3, torch.float32),
                   ("split", 20, 6, torch.float32)]  # 20 tokens: the first round by the reference


@pytest.mark.parametrize(("variant", "T1", "T2", "dtype"), RAW_ROUND_CASES)
def test_rounds_with_raw_key_factors_in_round_buffers(variant, T1, T2, dtype):
    """The runtime's calls: two rounds writing raw-key factors into slots of round buffers, the
    second folding the first's commit, then the flush (`gdn_commit`) of the second's. The second
    round's outputs and the state after both rounds' accepted tokens equal float64 steps over those
    tokens; k lands bit for bit; nothing outside the slots is written."""
    tuning = verify_table(variant)
    first = raw_inputs(800 + T1, B=2, T=T1, dtype=dtype, **SHAPES["grouped"])
    second = second_round(first, T2, 810 + T2, dtype=dtype, **SHAPES["grouped"])
    B, _, HK, dk = first["k"].shape
    HV, dv = first["v"].shape[2:]
    T_max = max(T1, T2)
    z_buf, g_buf = torch.full((2, B, T_max, HV, dv), float("nan")), torch.full((2, B, T_max, HV), float("nan"))
    k_buf = torch.full((2, B, T_max, HK, dk), float("nan"), dtype=dtype)
    slots = [dict(z_out=z_buf[s, :, :T], g_out=g_buf[s, :, :T], k_out=k_buf[s, :, :T]) for s, T in ((0, T1), (1, T2))]
    m1, m2 = [T1, 1], [2, T2]
    state = first["state"].clone()

    if T1 > gdn_triton.MAX_TOKENS:
        reference.gdn_verify_gated(**dict(first, state=state), **slots[0], raw_keys=True)
    else:
        gdn_triton.gdn_verify_gated(**dict(first, state=state), **slots[0], raw_keys=True, tuning=tuning)
    pending = (slots[0]["z_out"], slots[0]["k_out"], slots[0]["g_out"], torch.tensor(m1))
    o, _, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state), **slots[1], pending=pending, raw_keys=True,
                                          tuning=tuning)
    gdn_triton.gdn_commit(state[None], *(slots[1][n][None] for n in ("z_out", "k_out", "g_out")), torch.tensor(m2))

    o_ref, _ = two_rounds_oracle(first, second, m1)
    s_ref = torch.cat([gated_steps(dict(first, state=first["state"][b : b + 1], **{
        n: torch.cat((first[n][b : b + 1, :m1[b]], second[n][b : b + 1, :m2[b]]), dim=1) for n in "qkvab"}))[-1]
        for b in range(B)])
    bf16 = dtype == torch.bfloat16
    assert_close("state after both rounds", s_ref, state, PIECES_RATIO if bf16 and variant.startswith("split")
                 else FP32_RATIO)
    assert_close("o", o_ref, o, BF16_ROUNDING if bf16 else FP32_RATIO)
    assert torch.equal(k_buf[0, :, :T1], first["k"]) and torch.equal(k_buf[1, :, :T2], second["k"])
    for buf in (z_buf, g_buf, k_buf):
        assert buf[0, :, T1:].isnan().all() and buf[1, :, T2:].isnan().all()


def test_reference_checks_its_outputs_before_the_pending_commit():
    """A bad z_out is named before the pending commit writes the state or k_out is filled."""
    first, (z1, k1, g1) = first_round(4, 720, raw_keys=True, **SHAPES["grouped"])
    second = second_round(first, 3, 721, **SHAPES["grouped"])
    state, k_out = first["state"].clone(), torch.full(second["k"].shape, float("nan"))
    z_bad = torch.empty(*second["v"].shape, dtype=torch.bfloat16)
    for raw_keys in (False, True):
        with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: z_out has dtype torch.bfloat16")):
            reference.gdn_verify_gated(**dict(second, state=state), z_out=z_bad, k_out=k_out, raw_keys=raw_keys,
                                       pending=(z1, k1, g1, torch.tensor([4, 2])))
    assert torch.equal(state, first["state"]) and k_out.isnan().all()
