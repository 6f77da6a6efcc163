"""The all-layer commit kernel (Eq. 7) against the reference, under TRITON_INTERPRET=1: the shipped
table (the rank-1 loop up to four tokens, one product above) at every window length, both
methods at other lengths, bf16 factors, strided views, and its errors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import re

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from hybridspec.kernels.gdn.tuning import SHIPPED, CommitTuning  # noqa: E402
from tests.kernels.gdn_cases import FP32_RATIO, SHAPES, layer_factors  # noqa: E402
from tests.kernels.test_gdn_reference import COMMIT_ERRORS, REGIMES, make_inputs, recurrent_prefix  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402


@pytest.mark.parametrize("T", range(1, 17))
def test_commit_matches_reference(T):
    """Every m in 1..T at once (batch element b commits accepted[b]), three layers, one launch."""
    accepted = torch.randperm(T, generator=torch.Generator().manual_seed(T)) + 1  # [B = T]
    S0, z, k, g_cum = layer_factors(T, accepted, HK=1, HV=2, dk=20, dv=24)
    expected = S0.clone()
    reference.gdn_commit(expected, z, k, g_cum, accepted)

    states = S0.clone()
    gdn_triton.gdn_commit(states, z, k, g_cum, accepted)

    for layer in range(len(REGIMES)):
        assert_close(f"state[layer {layer}]", expected[layer], states[layer], FP32_RATIO)


def test_commit_bf16_factors():
    T, accepted = 9, torch.tensor([9, 1, 4])
    S0, z, k, g_cum = layer_factors(T, accepted, dtype=torch.bfloat16, **SHAPES["grouped"])
    expected = S0.clone()
    reference.gdn_commit(expected, z, k, g_cum, accepted)

    states = S0.clone()
    gdn_triton.gdn_commit(states, z, k, g_cum, accepted)

    assert_close("states (bf16 z, k)", expected, states, FP32_RATIO)


def test_commit_into_cache_views_from_buffer_slices():
    """States as a strided view of a bigger pool; factors as buf[:, :, :T] slices of [L, B, T_max, ...]."""
    T, accepted, shape = 7, torch.tensor([3, 7, 1]), SHAPES["grouped"]
    S0, z, k, g_cum = layer_factors(T, accepted, **shape)
    L, B = S0.shape[:2]
    pool = torch.full((L, B + 1, *S0.shape[2:]), 7.0)  # [L, slots, HV, dv, dk]
    states = pool[:, 1:]
    states.copy_(S0)
    z_buf = torch.full((L, B, 16, *z.shape[3:]), float("nan"))  # rejected rows may hold anything
    k_buf = torch.full((L, B, 16, *k.shape[3:]), float("nan"))
    g_buf = torch.full((L, B, 16, g_cum.shape[3]), float("nan"))
    z_buf[:, :, :T], k_buf[:, :, :T], g_buf[:, :, :T] = z, k, g_cum
    expected = S0.clone()
    reference.gdn_commit(expected, z, k, g_cum, accepted)

    gdn_triton.gdn_commit(states, z_buf[:, :, :T], k_buf[:, :, :T], g_buf[:, :, :T], accepted)

    assert_close("states", expected, states, FP32_RATIO)
    assert (pool[:, 0] == 7.0).all(), "gdn_commit wrote outside the states view"


def test_verify_and_commit_128_match_recurrence():
    """The model's size, dk = dv = 128, end to end against the recurrence (shipped table)."""
    T, accepted = 16, torch.tensor([16, 7])
    inputs = make_inputs(11, B=2, T=T, HK=1, HV=2, dk=128, dv=128)
    o_ref, prefix_states, _ = recurrent_prefix(inputs)  # [T+1, B, HV, dv, dk]

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)
    states = inputs["state"][None].clone()  # [1, B, HV, dv, dk]
    gdn_triton.gdn_commit(states, z[None], inputs["k"][None], g_cum[None], accepted)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("state", prefix_states[accepted, torch.arange(2)], states[0], FP32_RATIO)


COMMIT_VARIANTS = {
    "loop-over-m": CommitTuning(method="loop", block_v=8, num_warps=2),
    "dot": CommitTuning(method="dot", block_v=16, num_warps=4),
}
# both methods with every m of a 6-token window; the product (shipped above 4 tokens) with every m
# of 16 as well (test_commit_matches_reference runs the shipped loop up to 4 tokens)
COMMIT_CASES = [(variant, 6) for variant in COMMIT_VARIANTS] + [("dot", 16)]


@pytest.mark.parametrize(("variant", "T"), COMMIT_CASES)
def test_commit_methods_match_reference(variant, T):
    accepted = torch.randperm(T, generator=torch.Generator().manual_seed(5)) + 1  # every m in 1..T
    S0, z, k, g_cum = layer_factors(T, accepted, **SHAPES["grouped"])
    expected = S0.clone()
    reference.gdn_commit(expected, z, k, g_cum, accepted)

    states = S0.clone()
    gdn_triton.gdn_commit(states, z, k, g_cum, accepted,
                          tuning=SHIPPED.replace(commit={T: COMMIT_VARIANTS[variant]}))

    assert_close("states", expected, states, FP32_RATIO)


@pytest.mark.parametrize("message", COMMIT_ERRORS)
def test_commit_rejects_bad_argument_like_reference(message):
    inputs = make_inputs(0, B=2, T=3, **SHAPES["grouped"])
    _, z, g_cum = reference.gdn_verify(**inputs)
    args = dict(states=inputs["state"][None].clone(), z=z[None], k=inputs["k"][None],
                g_cum=g_cum[None], accepted=torch.tensor([1, 3]))
    COMMIT_ERRORS[message](args)
    with pytest.raises(ValueError, match=re.escape(f"gdn_commit: {message}")):
        gdn_triton.gdn_commit(**args)


COMMIT_KERNEL_ERRORS = {
    "T=17 tokens": lambda a: a.update(
        z=torch.cat([a["z"], a["z"][:, :, :1]], dim=2), k=torch.cat([a["k"], a["k"][:, :, :1]], dim=2),
        g_cum=torch.cat([a["g_cum"], a["g_cum"][:, :, :1]], dim=2)),
    "g_cum has dtype torch.bfloat16": lambda a: a.update(g_cum=a["g_cum"].bfloat16()),
    "k has dtype torch.float16": lambda a: a.update(k=a["k"].half()),
    "states has strides": lambda a: a.update(
        states=a["states"].transpose(-1, -2).contiguous().transpose(-1, -2)),
    "tensors on several devices": lambda a: a.update(accepted=a["accepted"].to("meta")),
}


@pytest.mark.parametrize("message", COMMIT_KERNEL_ERRORS)
def test_commit_rejects_what_the_kernel_cannot_take(message):
    inputs = make_inputs(0, B=2, T=16, **SHAPES["grouped"])
    _, z, g_cum = reference.gdn_verify(**inputs)
    args = dict(states=inputs["state"][None].clone(), z=z[None].contiguous(), k=inputs["k"][None],
                g_cum=g_cum[None].contiguous(), accepted=torch.tensor([1, 3]))
    COMMIT_KERNEL_ERRORS[message](args)
    with pytest.raises(ValueError, match=re.escape(f"gdn_commit: {message}")):
        gdn_triton.gdn_commit(**args)
