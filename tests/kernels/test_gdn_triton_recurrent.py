"""The recurrent verify kernel (forward substitution in state space) against the reference, under
TRITON_INTERPRET=1: at every length it ships (up to four tokens) on both shapes and at longer token
loops up to 16, raw or normalised inputs, bf16 or fp32."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from tests.kernels.gdn_cases import BF16_ROUNDING, FP32_RATIO, SHAPES  # noqa: E402
from tests.kernels.gdn_cases import bf16_gates, mixed_inputs, round_buffers, verify_table  # noqa: E402
from tests.kernels.gdn_cases import assert_slices_only, check_gated_verify, check_verify  # noqa: E402
from tests.kernels.test_gdn_reference import raw_inputs  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402

# both shapes with 32-row blocks (dv = 40: a full and a masked block) at every length the kernel
# ships (1 … 4) and at longer token loops (odd, a power of two, the longest); the one-warp shapes
# (4 rows, shipped, and 8) at a few lengths
LENGTHS = (1, 2, 3, 4, 5, 8, 13, 16)
RECURRENT_CASES = [("recurrent-32x4", shape, T) for shape in SHAPES for T in LENGTHS]
RECURRENT_CASES += [("recurrent-8x1", "grouped", T) for T in (1, 3, 4, 7)]
RECURRENT_CASES += [("recurrent-4x1", "ungrouped", T) for T in (2, 5, 6)]


@pytest.mark.parametrize(("variant", "shape", "T"), RECURRENT_CASES)
def test_recurrent_verify_matches_reference(variant, shape, T):
    """The state-space forward substitution gives the split kernel's o, z, g_cum at every length."""
    check_verify(gdn_triton.gdn_verify, mixed_inputs(300 + T, T, **SHAPES[shape]), verify_table(variant))


@pytest.mark.parametrize("T", [1, 5, 16])
def test_recurrent_verify_bf16_inputs_into_buffer_slices(T):
    inputs, widened = bf16_gates(mixed_inputs(350 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"]))
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)
    z_buf, g_buf, _ = round_buffers(inputs)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                        tuning=verify_table("recurrent-32x4"))

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert_slices_only(T, z_buf, g_buf)


GATED_CASES = [("grouped", T) for T in LENGTHS] + [("ungrouped", T) for T in (1, 2, 5, 12, 16)]


@pytest.mark.parametrize(("shape", "T"), GATED_CASES)
def test_recurrent_gated_verify_matches_oracle(shape, T):
    check_gated_verify(gdn_triton.gdn_verify_gated, raw_inputs(400 + T, B=2, T=T, **SHAPES[shape]),
                       verify_table("recurrent-32x4"))
