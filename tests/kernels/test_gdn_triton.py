"""The Triton GDN verification against the PyTorch reference, under TRITON_INTERPRET=1 on CPU
tensors: the public functions, their errors, the tuning table, and the split kernel (the default
of these tests at every length); the recurrent kernel, the commit and the folded commit have
test_gdn_triton_recurrent.py, _commit.py and _fold.py."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import inspect
import re

import pytest
import torch

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from hybridspec.kernels.gdn.launch import launch_options  # noqa: E402
from hybridspec.kernels.interpreter import interpreted  # noqa: E402
from hybridspec.kernels.gdn.tuning import SHIPPED, CommitTuning, Tuning, VerifyTuning  # noqa: E402
from tests.kernels.gdn_cases import BF16_ROUNDING, FP32_RATIO, PIECES_RATIO, SHAPES  # noqa: E402
from tests.kernels.gdn_cases import bf16_gates, mixed_inputs, round_buffers, verify_table  # noqa: E402
from tests.kernels.gdn_cases import assert_slices_only, check_gated_verify, check_verify  # noqa: E402
from tests.kernels.test_gdn_reference import STEP_ERRORS, gated_oracle, make_inputs, raw_inputs  # noqa: E402
from tests.tolerance import assert_close  # noqa: E402

if not interpreted():
    pytest.skip("hybridspec.kernels.gdn.triton was imported before TRITON_INTERPRET=1 was set",
                allow_module_level=True)

SPLIT = verify_table("split")


def test_signatures_match_reference():
    """The reference's parameters, then the keyword-only tuning table."""
    for name in ("gdn_verify", "gdn_verify_gated", "gdn_commit"):
        params = list(inspect.signature(getattr(gdn_triton, name)).parameters.values())
        assert params[-1].name == "tuning" and params[-1].kind == inspect.Parameter.KEYWORD_ONLY
        assert params[-1].default is SHIPPED
        assert (inspect.signature(getattr(gdn_triton, name)).replace(parameters=params[:-1])
                == inspect.signature(getattr(reference, name))), f"{name} signatures differ"


# ---------------------------------------------------------------------------------------------
# verification: Eqs. 3 and 10
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", range(1, 17))
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_matches_reference(shape, T):
    check_verify(gdn_triton.gdn_verify, mixed_inputs(T, T, **SHAPES[shape]), SPLIT)


@pytest.mark.parametrize("T", [1, 6, 16])
def test_verify_bf16_inputs(T):
    """bf16 q, k, v, g, beta are widened to fp32: equal to the fp32 reference on the same values."""
    inputs, widened = bf16_gates(mixed_inputs(50 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"]))
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)  # o_ref in fp32, not rounded

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, tuning=SPLIT)

    assert o.dtype == torch.bfloat16 and z.dtype == g_cum.dtype == torch.float32
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)


@pytest.mark.parametrize("T", [1, 6, 9, 16])
def test_split_verify_bf16_inputs_state_in_pieces(T):
    """bf16 q, k: their products are exact, and S_0 enters in two bf16 pieces, so z agrees with the
    fp32 reference on the widened values to the pieces' precision (o in bf16 to its rounding)."""
    inputs, widened = bf16_gates(mixed_inputs(650 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"]))
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, tuning=SPLIT)

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z, PIECES_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)


@pytest.mark.parametrize("impl", [reference, gdn_triton], ids=["reference", "triton"])
def test_factor_outputs_written_into_buffer_slices(impl):
    """z_out / g_out as non-contiguous slices buf[slot, :, :T] of round buffers [L, B, T_max, ...]."""
    T, shape = 5, SHAPES["grouped"]
    inputs = mixed_inputs(3, T, **shape)
    B, HV, dv = 4, shape["HV"], shape["dv"]
    z_buf = torch.full((2, B, 16, HV, dv), 7.0)  # [L, B, T_max, HV, dv]
    g_buf = torch.full((2, B, 16, HV), 7.0)  # [L, B, T_max, HV]
    z_out, g_out = z_buf[1, :, :T], g_buf[1, :, :T]
    assert not z_out.is_contiguous() and not g_out.is_contiguous()
    _, z_ref, g_ref = reference.gdn_verify(**inputs)

    _, z, g_cum = impl.gdn_verify(**inputs, z_out=z_out, g_out=g_out)

    assert z.data_ptr() == z_out.data_ptr() and g_cum.data_ptr() == g_out.data_ptr()
    assert_close("z_out", z_ref, z_out, FP32_RATIO)
    assert_close("g_out", g_ref, g_out, FP32_RATIO)
    assert (z_buf[0] == 7.0).all() and (z_buf[1, :, T:] == 7.0).all(), "z_out wrote outside its slice"
    assert (g_buf[0] == 7.0).all() and (g_buf[1, :, T:] == 7.0).all(), "g_out wrote outside its slice"


# ---------------------------------------------------------------------------------------------
# verification from raw projections: norms and gates inside the kernel
# ---------------------------------------------------------------------------------------------


GATED_CASES = [("grouped", T) for T in range(1, 17)] + [("ungrouped", T) for T in (1, 5, 16)]


@pytest.mark.parametrize(("shape", "T"), GATED_CASES)
def test_gated_verify_matches_oracle(shape, T):
    check_gated_verify(gdn_triton.gdn_verify_gated, raw_inputs(400 + T, B=2, T=T, **SHAPES[shape]), SPLIT)


@pytest.mark.parametrize("variant", ["split", "recurrent-8x1", "recurrent-32x4"])
def test_gated_verify_bf16_projections_into_round_buffers(variant):
    """bf16 q, k, v, a, b as the model has them; z, g_cum and the normalised k (bf16 cache) land
    in slices of larger buffers, nothing outside them is touched."""
    T = 6
    inputs = raw_inputs(450, B=2, T=T, dtype=torch.bfloat16, **SHAPES["grouped"])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)  # from the same bf16 values, in float64
    z_buf, g_buf, k_buf = round_buffers(inputs)

    o, _, _ = gdn_triton.gdn_verify_gated(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                          k_out=k_buf[1, :, :T], tuning=verify_table(variant))

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert_close("k_out (bf16)", k_ref, k_buf[1, :, :T], BF16_ROUNDING)
    assert_slices_only(T, z_buf, g_buf, k_buf)


@pytest.mark.parametrize("T", [2, 7, 16])
def test_split_gated_verify_matches_oracle(T):
    """Raw bf16 projections (fp32 ones: test_gated_verify_matches_oracle at every length): the norms
    (|k_i|^2 from the diagonal of K K^T) and gates inside the kernel on bf16 tensor-core products,
    the normalised k written out, every output in slices of the round buffers."""
    inputs = raw_inputs(700 + T, B=2, T=T, dtype=torch.bfloat16, **SHAPES["grouped"])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    z_buf, g_buf, k_buf = round_buffers(inputs)

    o, _, _ = gdn_triton.gdn_verify_gated(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                          k_out=k_buf[1, :, :T], tuning=SPLIT)

    assert_close("o", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], PIECES_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert_close("k_out", k_ref, k_buf[1, :, :T], BF16_ROUNDING)
    assert_slices_only(T, z_buf, g_buf, k_buf)


@pytest.mark.parametrize("variant", ["reference", "split", "split-late-keys", "recurrent-8x1", "recurrent-32x4"])
def test_gated_verify_raw_key_factors(variant):
    """raw_keys: k_out holds k bit for bit and z is z_i / |k_i| (the same outer products z_i k_i^T
    for the commit), o as without it."""
    T = 6
    verify = reference.gdn_verify_gated if variant == "reference" else gdn_triton.gdn_verify_gated
    tuning = {} if variant == "reference" else dict(tuning=verify_table(variant))
    inputs = raw_inputs(455, B=2, T=T, dtype=torch.bfloat16, **SHAPES["grouped"])
    o_ref, z_ref, _, _ = gated_oracle(inputs)
    HV, HK = inputs["v"].shape[2], inputs["k"].shape[2]
    norms = (inputs["k"].double() ** 2).sum(-1).add(reference.L2_EPS).sqrt()  # [B, T, HK]
    k_buf = torch.full((2, *inputs["k"].shape), float("nan"), dtype=torch.bfloat16)

    o, z, _ = verify(**inputs, k_out=k_buf[1], raw_keys=True, **tuning)

    assert torch.equal(k_buf[1], inputs["k"]) and k_buf[0].isnan().all()
    assert_close("z / |k|", z_ref / norms.repeat_interleave(HV // HK, dim=2)[..., None], z, FP32_RATIO)
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: raw_keys stores k as given, but k_out has "
                                                   "dtype torch.float32 and k torch.bfloat16")):
        verify(**inputs, k_out=torch.empty(inputs["k"].shape), raw_keys=True, **tuning)


@pytest.mark.parametrize("variant", ["split", "recurrent-8x1", "recurrent-32x4"])
def test_gated_verify_gates_across_decay_extremes(variant):
    """T = 1: g_cum is the gate itself, to fp32 accuracy from a + dt_bias = -30 to 30."""
    inputs = raw_inputs(460, B=32, T=1, HK=2, HV=8, dk=8, dv=8, a_range=(-30.0, 30.0))
    _, _, g_ref, _ = gated_oracle(inputs)

    _, _, g_cum = gdn_triton.gdn_verify_gated(**inputs, tuning=verify_table(variant))

    assert ((g_cum.double() - g_ref) / g_ref).abs().max().item() < FP32_RATIO


# ---------------------------------------------------------------------------------------------
# boundary errors, launch options, the tuning table
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", STEP_ERRORS)
def test_verify_rejects_bad_argument_like_reference(message):
    inputs = make_inputs(0, B=2, T=3, **SHAPES["grouped"])
    STEP_ERRORS[message](inputs)
    with pytest.raises(ValueError, match=re.escape(f"gdn_verify: {message}")):
        gdn_triton.gdn_verify(**inputs)


VERIFY_KERNEL_ERRORS = {
    "T=17 tokens, the Triton kernels take at most 16": lambda a: a.update(
        {n: torch.cat([a[n], a[n][:, :1]], dim=1) for n in ("q", "k", "v", "g", "beta")}),
    "q has dtype torch.float16": lambda a: a.update(q=a["q"].half()),
    "beta has dtype torch.float64": lambda a: a.update(beta=a["beta"].double()),
    "v has strides": lambda a: a.update(v=a["v"].transpose(-1, -2).contiguous().transpose(-1, -2)),
    "tensors on several devices": lambda a: a.update(state=a["state"].to("meta")),
    "z_out has shape": lambda a: a.update(z_out=torch.empty(2, 16, 6, 39)),
    "z_out has dtype": lambda a: a.update(z_out=torch.empty(2, 16, 6, 40, dtype=torch.bfloat16)),
    "g_out has shape": lambda a: a.update(g_out=torch.empty(2, 16, 5)),
}


@pytest.mark.parametrize("message", VERIFY_KERNEL_ERRORS)
def test_verify_rejects_what_the_kernel_cannot_take(message):
    inputs = make_inputs(0, B=2, T=16, **SHAPES["grouped"])
    VERIFY_KERNEL_ERRORS[message](inputs)
    with pytest.raises(ValueError, match=re.escape(f"gdn_verify: {message}")):
        gdn_triton.gdn_verify(**inputs)


def test_gated_verify_names_a_bad_gate_argument():
    inputs = raw_inputs(470, B=1, T=3, **SHAPES["grouped"])
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: a has shape")):
        gdn_triton.gdn_verify_gated(**dict(inputs, a=inputs["a"][:, :2]))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: dt_bias has shape")):
        gdn_triton.gdn_verify_gated(**dict(inputs, dt_bias=inputs["dt_bias"][:-1]))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: k_out has shape")):
        gdn_triton.gdn_verify_gated(**inputs, k_out=torch.empty(1, 3, 1, 1))


def test_programmatic_dependent_launch_only_where_it_can_run():
    """pdl=True asks for griddepcontrol (inline PTX): only compiled, on CUDA of SM90+; under the
    interpreter, and on CPU tensors, the same tunings launch plainly (every test here runs them)."""
    cpu = torch.zeros(1)
    assert launch_options(True, cpu) == {"USE_GDC": False}
    assert launch_options(False, cpu) == {"USE_GDC": False}


def test_shipped_tuning_is_read_only_and_complete():
    """The recurrent kernel up to four tokens, the split kernel from five; the commit's loop up to
    four tokens, its product from five. Nothing can overwrite an entry."""
    assert [SHIPPED.verify[T].method for T in range(1, 17)] == ["recurrent"] * 4 + ["split"] * 12
    assert [SHIPPED.commit[T].method for T in range(1, 17)] == ["loop"] * 4 + ["dot"] * 12
    with pytest.raises(TypeError):
        SHIPPED.verify[3] = SHIPPED.verify[16]  # type: ignore[index]
    with pytest.raises(ValueError, match=re.escape("Tuning: verify covers lengths [1, 2], expected 1..16")):
        Tuning({1: SHIPPED.verify[1], 2: SHIPPED.verify[2]}, SHIPPED.commit)


def test_tunings_name_a_bad_field():
    with pytest.raises(ValueError, match="VerifyTuning: method='chunked', expected recurrent or split"):
        VerifyTuning(method="chunked", block_v=16, num_warps=2)
    with pytest.raises(ValueError, match="VerifyTuning: late_keys with method 'recurrent', only the split kernel"):
        VerifyTuning(method="recurrent", block_v=8, num_warps=1, late_keys=True)
    with pytest.raises(ValueError, match="VerifyTuning: block_v=24 is not a power of two"):
        VerifyTuning(method="split", block_v=24, num_warps=4)
    with pytest.raises(ValueError, match="CommitTuning: method='fold', expected loop or dot"):
        CommitTuning(method="fold", block_v=16, num_warps=4)
    with pytest.raises(ValueError, match="CommitTuning: block_v=8 with method dot, expected at least 16"):
        CommitTuning(method="dot", block_v=8, num_warps=4)
    with pytest.raises(ValueError, match="CommitTuning: num_warps=3 is not a power of two"):
        CommitTuning(method="loop", block_v=16, num_warps=3)
