"""The recurrent verify kernel (forward substitution in state space) against the reference, under
TRITON_INTERPRET=1: at every length on both shapes (it ships up to four tokens; the other lengths
check the same code paths with longer token loops), raw or normalised inputs, bf16 or fp32."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from tests.kernels.gdn_cases import (  # noqa: E402
    BF16_ROUNDING,
    FP32_RATIO,
    SHAPES,
    bf16_gates,
    mixed_inputs,
    verify_table,
)
from tests.kernels.test_gdn_reference import gated_oracle, raw_inputs  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402

# every T on both shapes with 32-row blocks (dv = 40: a full and a masked block); the shipped
# one-warp shapes (8 rows up to T = 2, 4 rows at T = 3, 4) at a few lengths
RECURRENT_CASES = [("recurrent-32x4", shape, T) for shape in SHAPES for T in range(1, 17)]
RECURRENT_CASES += [("recurrent-8x1", "grouped", T) for T in (1, 3, 4, 7)]
RECURRENT_CASES += [("recurrent-4x1", "ungrouped", T) for T in (2, 5, 6)]


@pytest.mark.parametrize(("variant", "shape", "T"), RECURRENT_CASES)
def test_recurrent_verify_matches_reference(variant, shape, T):
    """The state-space forward substitution gives the split kernel's o, z, g_cum at every length."""
    inputs = mixed_inputs(300 + T, T, **SHAPES[shape])
    state_before = inputs["state"].clone()
    o_ref, z_ref, g_ref = reference.gdn_verify(**inputs)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, tuning=verify_table(variant))

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert torch.equal(inputs["state"], state_before), "gdn_verify modified its state argument"


@pytest.mark.parametrize("T", [1, 5, 16])
def test_recurrent_verify_bf16_inputs_into_buffer_slices(T):
    inputs, widened = bf16_gates(mixed_inputs(350 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"]))
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)
    B, _, HV, dv = inputs["v"].shape
    z_buf, g_buf = torch.full((2, B, 16, HV, dv), float("nan")), torch.full((2, B, 16, HV), float("nan"))

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                        tuning=verify_table("recurrent-32x4"))

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert z_buf[0].isnan().all() and z_buf[1, :, T:].isnan().all() and g_buf[1, :, T:].isnan().all()


GATED_CASES = [("grouped", T) for T in range(1, 17)] + [("ungrouped", T) for T in (1, 2, 5, 12, 16)]


@pytest.mark.parametrize(("shape", "T"), GATED_CASES)
def test_recurrent_gated_verify_matches_oracle(shape, T):
    inputs = raw_inputs(400 + T, B=2, T=T, **SHAPES[shape])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    k_out = torch.full(inputs["k"].shape, float("nan"))

    o, z, g_cum = gdn_triton.gdn_verify_gated(**inputs, k_out=k_out, tuning=verify_table("recurrent-32x4"))

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert_close("k_out", k_ref, k_out, FP32_RATIO)
