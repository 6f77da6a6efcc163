"""The Triton GDN kernels against the PyTorch reference, under TRITON_INTERPRET=1 on CPU tensors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels are interpreted

import dataclasses
import inspect
import re

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from hybridspec.kernels.gdn import reference  # noqa: E402
from hybridspec.kernels.gdn import triton as gdn_triton  # noqa: E402
from tests.kernels.test_gdn_reference import (  # noqa: E402
    COMMIT_ERRORS,
    REGIMES,
    STEP_ERRORS,
    gated_oracle,
    gated_steps,
    make_inputs,
    raw_inputs,
    recurrent_prefix,
)
from tests.tolerance import assert_close  # noqa: E402

if type(gdn_triton._gdn_verify_kernel).__name__ != "InterpretedFunction":
    pytest.skip("hybridspec.kernels.gdn.triton was imported before TRITON_INTERPRET=1 was set",
                allow_module_level=True)

# awkward sizes: grouped value heads with dk, dv not powers of two (dv = 40 spans a full and a
# masked block of 32 rows), and plain multi-head (HV = HK) with a single masked block
SHAPES = {
    "grouped": dict(HK=3, HV=6, dk=24, dv=40),
    "ungrouped": dict(HK=2, HV=2, dk=20, dv=24),
}
FP32_RATIO = 1e-5
# o in bf16 is off by its rounding: at most one ulp, 2^-8..2^-7 relative, whichever the rounding
# mode (the interpreter truncates, GPUs round to nearest)
BF16_ROUNDING = 2**-7


@pytest.fixture(autouse=True)
def split_kernel_unless_told(monkeypatch):
    """The shipped VERIFY_TUNING takes the recurrent kernel up to four tokens and the split kernel
    from five; here the default is the shipped split tuning at every length, so the tests without a
    variant cover it at every T (the recurrent and blocked kernels have their own tests below; the
    shipped choice runs end to end in tests/runtime/test_triton_backend.py)."""
    monkeypatch.setattr(gdn_triton, "VERIFY_TUNING", {T: gdn_triton._SPLIT for T in range(1, 17)})



def aligned_inputs(seed: int, T: int, dtype=torch.float32, **shape) -> dict:
    """Nearly parallel keys, beta ~ 0.9..0.99 and decay ~ 1: H - I has entries near 1 (Eq. 3).

    The hardest case for a product-form inverse: powers of H - I grow like binomial coefficients.
    """
    inputs = make_inputs(seed, B=1, T=T, regime="near_one", dtype=dtype, **shape)
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(1, 1, shape["HK"], shape["dk"], generator=gen)
    k = F.normalize(common + 0.1 * torch.randn(1, T, shape["HK"], shape["dk"], generator=gen), dim=-1)
    beta = 0.9 + 0.09 * torch.rand(1, T, shape["HV"], generator=gen)  # [1, T, HV]
    return dict(inputs, k=k.to(dtype), beta=beta)


def mixed_inputs(seed: int, T: int, dtype=torch.float32, **shape) -> dict:
    """gdn_verify arguments with one batch element per decay regime (ordinary, g ~ -20..-60,
    g ~ -1e-6) and one with aligned keys (`aligned_inputs`): B = 4."""
    parts = [make_inputs(seed + i, B=1, T=T, regime=regime, dtype=dtype, **shape)
             for i, regime in enumerate(REGIMES)]
    parts.append(aligned_inputs(seed + len(REGIMES), T, dtype, **shape))
    merged = {name: torch.cat([p[name] for p in parts]) for name in ("q", "k", "v", "g", "beta", "state")}
    return dict(merged, scale=parts[0]["scale"])


def layer_factors(T: int, accepted: torch.Tensor, dtype=torch.float32, **shape) -> tuple:
    """Reference factors of len(REGIMES) layers (layer l uses regime l) for B = len(accepted).

    Returns S_0 [L, B, HV, dv, dk], z [L, B, T, HV, dv], k [L, B, T, HK, dk], g_cum [L, B, T, HV].
    """
    S0s, zs, ks, g_cums = [], [], [], []
    for layer, regime in enumerate(REGIMES):
        inputs = make_inputs(100 * T + layer, B=len(accepted), T=T, regime=regime, **shape)
        _, z, g_cum = reference.gdn_verify(**inputs)
        S0s.append(inputs["state"])
        zs.append(z.to(dtype).contiguous())  # the reference's outputs are permuted views
        ks.append(inputs["k"].to(dtype))
        g_cums.append(g_cum.contiguous())
    return torch.stack(S0s), torch.stack(zs), torch.stack(ks), torch.stack(g_cums)


def test_signatures_match_reference():
    for name in ("gdn_verify", "gdn_verify_gated", "gdn_commit"):
        assert (inspect.signature(getattr(gdn_triton, name))
                == inspect.signature(getattr(reference, name))), f"{name} signatures differ"


# ---------------------------------------------------------------------------------------------
# verification: Eqs. 3 and 10
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", range(1, 17))
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_matches_reference(shape, T):
    inputs = mixed_inputs(T, T, **SHAPES[shape])
    state_before = inputs["state"].clone()
    o_ref, z_ref, g_ref = reference.gdn_verify(**inputs)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)

    assert o.dtype == z.dtype == g_cum.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert torch.equal(inputs["state"], state_before), "gdn_verify modified its state argument"


@pytest.mark.parametrize("T", [1, 6, 16])
def test_verify_bf16_inputs(T):
    """bf16 q, k, v, g, beta are widened to fp32: equal to the fp32 reference on the same values."""
    inputs = mixed_inputs(50 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"])
    inputs.update(g=inputs["g"].bfloat16(), beta=inputs["beta"].bfloat16())
    widened = dict(inputs, **{name: inputs[name].float() for name in ("q", "k", "v", "g", "beta")})
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)  # o_ref in fp32, not rounded

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)

    assert o.dtype == torch.bfloat16 and z.dtype == g_cum.dtype == torch.float32
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z, FP32_RATIO)
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
# commit: Eq. 7
# ---------------------------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------------------------
# the model's size: dk = dv = 128, end to end against the recurrence
# ---------------------------------------------------------------------------------------------


def test_verify_and_commit_128_match_recurrence():
    T, accepted = 16, torch.tensor([16, 7])
    inputs = make_inputs(11, B=2, T=T, HK=1, HV=2, dk=128, dv=128)
    o_ref, prefix_states, _ = recurrent_prefix(inputs)  # [T+1, B, HV, dv, dk]

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)
    states = inputs["state"][None].clone()  # [1, B, HV, dv, dk]
    gdn_triton.gdn_commit(states, z[None], inputs["k"][None], g_cum[None], accepted)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("state", prefix_states[accepted, torch.arange(2)], states[0], FP32_RATIO)


# ---------------------------------------------------------------------------------------------
# boundary errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("message", STEP_ERRORS)
def test_verify_rejects_bad_argument_like_reference(message):
    inputs = make_inputs(0, B=2, T=3, **SHAPES["grouped"])
    STEP_ERRORS[message](inputs)
    with pytest.raises(ValueError, match=re.escape(f"gdn_verify: {message}")):
        gdn_triton.gdn_verify(**inputs)


@pytest.mark.parametrize("message", COMMIT_ERRORS)
def test_commit_rejects_bad_argument_like_reference(message):
    inputs = make_inputs(0, B=2, T=3, **SHAPES["grouped"])
    _, z, g_cum = reference.gdn_verify(**inputs)
    args = dict(states=inputs["state"][None].clone(), z=z[None], k=inputs["k"][None],
                g_cum=g_cum[None], accepted=torch.tensor([1, 3]))
    COMMIT_ERRORS[message](args)
    with pytest.raises(ValueError, match=re.escape(f"gdn_commit: {message}")):
        gdn_triton.gdn_commit(**args)


VERIFY_KERNEL_ERRORS = {
    "T=17 tokens, the Triton kernels take at most 16": lambda a: a.update(
        {n: torch.cat([a[n], a[n][:, :1]], dim=1) for n in ("q", "k", "v", "g", "beta")}),
    "q has dtype torch.float16": lambda a: a.update(q=a["q"].half()),
    "beta has dtype torch.float64": lambda a: a.update(beta=a["beta"].double()),
    "v has strides": lambda a: a.update(v=a["v"].transpose(-1, -2).contiguous().transpose(-1, -2)),
    "state is on meta": lambda a: a.update(state=a["state"].to("meta")),
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


COMMIT_KERNEL_ERRORS = {
    "T=17 tokens": lambda a: a.update(
        z=torch.cat([a["z"], a["z"][:, :, :1]], dim=2), k=torch.cat([a["k"], a["k"][:, :, :1]], dim=2),
        g_cum=torch.cat([a["g_cum"], a["g_cum"][:, :, :1]], dim=2)),
    "g_cum has dtype torch.bfloat16": lambda a: a.update(g_cum=a["g_cum"].bfloat16()),
    "k has dtype torch.float16": lambda a: a.update(k=a["k"].half()),
    "states has strides": lambda a: a.update(
        states=a["states"].transpose(-1, -2).contiguous().transpose(-1, -2)),
    "accepted is on meta": lambda a: a.update(accepted=a["accepted"].to("meta")),
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


# ---------------------------------------------------------------------------------------------
# launch variants of bench/gdn_tuning.py: every code path of the kernels, not only the defaults
# ---------------------------------------------------------------------------------------------

VERIFY_VARIANTS = {
    "range-ieee": gdn_triton.VerifyTuning(block_v=16, block_k=16, num_warps=2, key_dot="ieee"),
    "unroll-tf32x3": gdn_triton.VerifyTuning(block_v=8, block_k=32, num_warps=2, key_dot="tf32x3", unroll=True),
    "unroll-ieee-one-chunk": gdn_triton.VerifyTuning(block_v=32, block_k=128, num_warps=4, key_dot="ieee",
                                                    unroll=True, num_stages=1),
    "solve-tf32x3": gdn_triton.VerifyTuning(block_v=16, block_k=16, num_warps=2, key_dot="tf32x3", num_stages=4,
                                            solve_dot="tf32x3"),
}


@pytest.mark.parametrize("T", [2, 7, 16])
@pytest.mark.parametrize("variant", VERIFY_VARIANTS)
def test_verify_launch_variants_match_reference(variant, T, monkeypatch):
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, VERIFY_VARIANTS[variant])
    inputs = mixed_inputs(200 + T, T, **SHAPES["grouped"])
    o_ref, z_ref, _ = reference.gdn_verify(**inputs)

    o, z, _ = gdn_triton.gdn_verify(**inputs)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)


RECURRENT = {"recurrent-8x1": gdn_triton.VerifyTuning(block_v=8, num_warps=1, method="recurrent"),
             "recurrent-32x4": gdn_triton.VerifyTuning(block_v=32, num_warps=4, method="recurrent"),
             "recurrent-4x1": gdn_triton.VerifyTuning(block_v=4, num_warps=1, num_stages=1, method="recurrent"),
             "recurrent-32x4-prefetch": gdn_triton.VerifyTuning(block_v=32, num_warps=4, method="recurrent",
                                                                prefetch=True),
             "recurrent-4x1-prefetch": gdn_triton.VerifyTuning(block_v=4, num_warps=1, num_stages=1,
                                                               method="recurrent", prefetch=True),
             "recurrent-8x1-prefetch": gdn_triton.VerifyTuning(block_v=8, num_warps=1, num_stages=1,
                                                               method="recurrent", prefetch=True)}


# every T on both shapes with 32-row blocks (dv = 40: a full and a masked block; the interpreter's
# cost is per program, so fewer programs keep CI short); 8-row blocks at a few T
RECURRENT_CASES = [("recurrent-32x4", shape, T) for shape in SHAPES for T in range(1, 17)]
RECURRENT_CASES += [("recurrent-8x1", "grouped", T) for T in (1, 7)]
RECURRENT_CASES += [("recurrent-4x1", "ungrouped", T) for T in (2, 6)]
# prefetching: lengths around each power of two; its gated path at more lengths below; the shipped
# one-warp choices (VERIFY_TUNING: 4 rows at T = 2, 8 rows at T = 3 and 4)
RECURRENT_CASES += [("recurrent-32x4-prefetch", "grouped", T) for T in (1, 3, 8, 9, 16)]
RECURRENT_CASES += [("recurrent-4x1-prefetch", "ungrouped", T) for T in (2, 5)]
RECURRENT_CASES += [("recurrent-8x1-prefetch", "grouped", T) for T in (3, 4)]


SPLIT = {"split-32x4": gdn_triton._SPLIT,  # the shipped choice from five tokens on (two pieces, fence, PDL)
         "split-16x2-3": gdn_triton.VerifyTuning(block_v=16, num_warps=2, num_stages=1, method="split", split=3)}
# S_0 in two bf16 pieces carries 2^-16 of it relative under the interpreter, which truncates when it
# narrows to bf16 (2^-18 on a GPU, which rounds to nearest); three pieces carry 2^-24
SPLIT_RATIO = {2: 2**-15, 3: FP32_RATIO}


@pytest.mark.parametrize(("variant", "shape", "T"), RECURRENT_CASES)
def test_recurrent_verify_matches_reference(variant, shape, T, monkeypatch):
    """The state-space forward substitution gives the split kernel's o, z, g_cum at every length."""
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, RECURRENT[variant])
    inputs = mixed_inputs(300 + T, T, **SHAPES[shape])
    state_before = inputs["state"].clone()
    o_ref, z_ref, g_ref = reference.gdn_verify(**inputs)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert torch.equal(inputs["state"], state_before), "gdn_verify modified its state argument"


@pytest.mark.parametrize("T", [1, 5, 16])
def test_recurrent_verify_bf16_inputs_into_buffer_slices(T, monkeypatch):
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, RECURRENT["recurrent-32x4"])
    inputs = mixed_inputs(350 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"])
    inputs.update(g=inputs["g"].bfloat16(), beta=inputs["beta"].bfloat16())
    widened = dict(inputs, **{name: inputs[name].float() for name in ("q", "k", "v", "g", "beta")})
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)
    B, _, HV, dv = inputs["v"].shape
    z_buf, g_buf = torch.full((2, B, 16, HV, dv), float("nan")), torch.full((2, B, 16, HV), float("nan"))

    o, z, g_cum = gdn_triton.gdn_verify(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T])

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert z_buf[0].isnan().all() and z_buf[1, :, T:].isnan().all() and g_buf[1, :, T:].isnan().all()


# ---------------------------------------------------------------------------------------------
# verification from raw projections: norms and gates inside the kernels
# ---------------------------------------------------------------------------------------------

METHODS = {"split": None, "blocked": gdn_triton.VerifyTuning(), **RECURRENT,  # None: this file's default
           "split-late-keys": dataclasses.replace(gdn_triton._SPLIT, late_keys=True)}


def _with_method(monkeypatch, variant: str, T: int) -> None:
    if METHODS[variant] is not None:
        monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, METHODS[variant])


GATED_CASES = [(variant, shape, T) for variant in ("split", "recurrent-32x4") for shape, lengths in
               (("grouped", range(1, 17)), ("ungrouped", (1, 5, 16))) for T in lengths]
GATED_CASES += [("recurrent-32x4-prefetch", shape, T) for shape in SHAPES for T in (2, 5, 12, 16)]
GATED_CASES += [("blocked", "grouped", T) for T in (1, 5, 16)]


@pytest.mark.parametrize(("variant", "shape", "T"), GATED_CASES)
def test_gated_verify_matches_oracle(variant, shape, T, monkeypatch):
    _with_method(monkeypatch, variant, T)
    inputs = raw_inputs(400 + T, B=2, T=T, **SHAPES[shape])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    k_out = torch.full(inputs["k"].shape, float("nan"))

    o, z, g_cum = gdn_triton.gdn_verify_gated(**inputs, k_out=k_out)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert_close("k_out", k_ref, k_out, FP32_RATIO)


@pytest.mark.parametrize("variant", ["split", "blocked", "recurrent-8x1", "recurrent-32x4-prefetch"])
def test_gated_verify_bf16_projections_into_round_buffers(variant, monkeypatch):
    """bf16 q, k, v, a, b as the model has them; z, g_cum and the normalised k (bf16 cache) land
    in slices of larger buffers, nothing outside them is touched."""
    T = 6
    _with_method(monkeypatch, variant, T)
    inputs = raw_inputs(450, B=2, T=T, dtype=torch.bfloat16, **SHAPES["grouped"])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)  # from the same bf16 values, in float64
    B, _, HK, dk = inputs["k"].shape
    HV, dv = inputs["v"].shape[2:]
    z_buf, g_buf = torch.full((2, B, 16, HV, dv), float("nan")), torch.full((2, B, 16, HV), float("nan"))
    k_buf = torch.full((2, B, 16, HK, dk), float("nan"), dtype=torch.bfloat16)

    o, _, _ = gdn_triton.gdn_verify_gated(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                          k_out=k_buf[1, :, :T])

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO)
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert_close("k_out (bf16)", k_ref, k_buf[1, :, :T], BF16_ROUNDING)
    for buf in (z_buf, g_buf, k_buf):
        assert buf[0].isnan().all() and buf[1, :, T:].isnan().all()


@pytest.mark.parametrize("variant", ["reference", "split", "split-late-keys", "blocked", "recurrent-8x1",
                                     "recurrent-32x4-prefetch"])
def test_gated_verify_raw_key_factors(variant, monkeypatch):
    """raw_keys: k_out holds k bit for bit and z is z_i / |k_i| (the same outer products z_i k_i^T
    for the commit), o as without it."""
    T = 6
    verify = reference.gdn_verify_gated if variant == "reference" else gdn_triton.gdn_verify_gated
    if variant != "reference":
        _with_method(monkeypatch, variant, T)
    inputs = raw_inputs(455, B=2, T=T, dtype=torch.bfloat16, **SHAPES["grouped"])
    o_ref, z_ref, _, _ = gated_oracle(inputs)
    HV, HK = inputs["v"].shape[2], inputs["k"].shape[2]
    norms = (inputs["k"].double() ** 2).sum(-1).add(reference.L2_EPS).sqrt()  # [B, T, HK]
    k_buf = torch.full((2, *inputs["k"].shape), float("nan"), dtype=torch.bfloat16)

    o, z, _ = verify(**inputs, k_out=k_buf[1], raw_keys=True)

    assert torch.equal(k_buf[1], inputs["k"]) and k_buf[0].isnan().all()
    assert_close("z / |k|", z_ref / norms.repeat_interleave(HV // HK, dim=2)[..., None], z, FP32_RATIO)
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: raw_keys stores k as given, but k_out has "
                                                   "dtype torch.float32 and k torch.bfloat16")):
        verify(**inputs, k_out=torch.empty(inputs["k"].shape), raw_keys=True)


@pytest.mark.parametrize("variant", ["split", "recurrent-8x1", "recurrent-32x4-prefetch"])
def test_gated_verify_gates_across_decay_extremes(variant, monkeypatch):
    """T = 1: g_cum is the gate itself, to fp32 accuracy from a + dt_bias = -30 to 30."""
    _with_method(monkeypatch, variant, 1)
    inputs = raw_inputs(460, B=32, T=1, HK=2, HV=8, dk=8, dv=8, a_range=(-30.0, 30.0))
    _, _, g_ref, _ = gated_oracle(inputs)

    _, _, g_cum = gdn_triton.gdn_verify_gated(**inputs)

    assert ((g_cum.double() - g_ref) / g_ref).abs().max().item() < FP32_RATIO


def test_gated_verify_names_a_bad_gate_argument():
    inputs = raw_inputs(470, B=1, T=3, **SHAPES["grouped"])
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: a has shape")):
        gdn_triton.gdn_verify_gated(**dict(inputs, a=inputs["a"][:, :2]))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: dt_bias has shape")):
        gdn_triton.gdn_verify_gated(**dict(inputs, dt_bias=inputs["dt_bias"][:-1]))
    with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: k_out has shape")):
        gdn_triton.gdn_verify_gated(**inputs, k_out=torch.empty(1, 3, 1, 1))


COMMIT_VARIANTS = {
    "loop-over-m": gdn_triton.CommitTuning(block_v=8, num_warps=2),
    "unrolled-masked": gdn_triton.CommitTuning(block_v=8, num_warps=2, unroll=True),
    "dot-tf32x3": gdn_triton.CommitTuning(block_v=16, num_warps=4, method="dot"),
    "dot-ieee": gdn_triton.CommitTuning(block_v=32, num_warps=1, method="dot", key_dot="ieee"),
}


# every variant with every m of a 6-token window; the products (the shipped choice above 4 tokens)
# with every m of 16 as well (the rank-1 loops at 16 tokens took 40 s of the interpreter's time, and
# test_commit_matches_reference runs the shipped loop up to 4 tokens)
COMMIT_CASES = [(variant, 6) for variant in COMMIT_VARIANTS] + [("dot-tf32x3", 16), ("dot-ieee", 16)]


@pytest.mark.parametrize(("variant", "T"), COMMIT_CASES)
def test_commit_launch_variants_match_reference(variant, T, monkeypatch):
    accepted = torch.randperm(T, generator=torch.Generator().manual_seed(5)) + 1  # every m in 1..T
    monkeypatch.setitem(gdn_triton.COMMIT_TUNING, T, COMMIT_VARIANTS[variant])
    S0, z, k, g_cum = layer_factors(T, accepted, **SHAPES["grouped"])
    expected = S0.clone()
    reference.gdn_commit(expected, z, k, g_cum, accepted)

    states = S0.clone()
    gdn_triton.gdn_commit(states, z, k, g_cum, accepted)

    assert_close("states", expected, states, FP32_RATIO)


def test_programmatic_dependent_launch_only_where_it_can_run():
    """pdl=True asks for griddepcontrol (inline PTX): only compiled, on CUDA of SM90+; under the
    interpreter, and on CPU tensors, the same tunings launch plainly and give the same numbers."""
    cpu = torch.zeros(1)
    assert gdn_triton._launch_options(True, cpu) == {"USE_GDC": False}
    assert gdn_triton._launch_options(False, cpu) == {"USE_GDC": False}


@pytest.mark.parametrize("variant", ["blocked", "recurrent"])
def test_pdl_tunings_match_reference_where_pdl_is_off(variant, monkeypatch):
    T = 5
    tuning = gdn_triton.VerifyTuning(pdl=True) if variant == "blocked" else dataclasses.replace(
        RECURRENT["recurrent-32x4-prefetch"], pdl=True)
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, tuning)
    monkeypatch.setitem(gdn_triton.COMMIT_TUNING, T, gdn_triton.CommitTuning(pdl=True))
    inputs = mixed_inputs(480, T, **SHAPES["grouped"])
    o_ref, z_ref, g_ref = reference.gdn_verify(**inputs)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)
    accepted = torch.tensor([3, 5, 1, 2])  # one m per batch element (B = 4)
    expected, states = inputs["state"][None].clone(), inputs["state"][None].clone()
    reference.gdn_commit(expected, z_ref[None], inputs["k"][None], g_ref[None], accepted)
    gdn_triton.gdn_commit(states, z[None], inputs["k"][None], g_cum[None], accepted)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("states", expected, states, FP32_RATIO)


def test_commit_tuning_names_a_bad_field():
    with pytest.raises(ValueError, match="CommitTuning: method='fold', expected loop or dot"):
        gdn_triton.CommitTuning(method="fold")
    with pytest.raises(ValueError, match="CommitTuning: block_v=8 with method dot, expected at least 16"):
        gdn_triton.CommitTuning(block_v=8, method="dot")
    with pytest.raises(ValueError, match="CommitTuning: num_warps=3 is not a power of two"):
        gdn_triton.CommitTuning(num_warps=3)


# ---------------------------------------------------------------------------------------------
# the split kernel: blocked form ordered for latency, bf16 products of a split state (SPLIT above;
# its fp32 path at every length is this file's default)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", [1, 6, 9, 16])
@pytest.mark.parametrize("variant", list(SPLIT))
def test_split_verify_bf16_inputs_state_in_pieces(variant, T, monkeypatch):
    """bf16 q, k: their products are exact, and S_0 enters in bf16 pieces, so z agrees with the fp32
    reference on the widened values to the pieces' precision (o in bf16 to its rounding)."""
    tuning = SPLIT[variant]
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, tuning)
    inputs = mixed_inputs(650 + T, T, dtype=torch.bfloat16, **SHAPES["grouped"])
    inputs.update(g=inputs["g"].bfloat16(), beta=inputs["beta"].bfloat16())
    widened = dict(inputs, **{name: inputs[name].float() for name in ("q", "k", "v", "g", "beta")})
    o_ref, z_ref, g_ref = reference.gdn_verify(**widened)

    o, z, g_cum = gdn_triton.gdn_verify(**inputs)

    assert o.dtype == torch.bfloat16
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)
    assert_close("z", z_ref, z, SPLIT_RATIO[tuning.split])
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)


@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=["bf16"])
@pytest.mark.parametrize("T", [2, 7, 16])
def test_split_gated_verify_matches_oracle(T, dtype, monkeypatch):
    """Raw bf16 projections (fp32 ones: test_gated_verify_matches_oracle at every length): the norms
    (|k_i|^2 from the diagonal of K K^T) and gates inside the kernel on bf16 tensor-core products,
    the normalised k written out, every output in slices of the round buffers."""
    tuning = SPLIT["split-32x4"]
    monkeypatch.setitem(gdn_triton.VERIFY_TUNING, T, tuning)
    inputs = raw_inputs(700 + T, B=2, T=T, dtype=dtype, **SHAPES["grouped"])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    B, _, HK, dk = inputs["k"].shape
    HV, dv = inputs["v"].shape[2:]
    z_buf, g_buf = torch.full((2, B, 16, HV, dv), float("nan")), torch.full((2, B, 16, HV), float("nan"))
    k_buf = torch.full((2, B, 16, HK, dk), float("nan"), dtype=dtype)

    o, _, _ = gdn_triton.gdn_verify_gated(**inputs, z_out=z_buf[1, :, :T], g_out=g_buf[1, :, :T],
                                          k_out=k_buf[1, :, :T])

    rounding = FP32_RATIO if dtype == torch.float32 else BF16_ROUNDING
    assert_close("o", o_ref, o, rounding)
    assert_close("z", z_ref, z_buf[1, :, :T], FP32_RATIO if dtype == torch.float32 else SPLIT_RATIO[2])
    assert_close("g_cum", g_ref, g_buf[1, :, :T], FP32_RATIO)
    assert_close("k_out", k_ref, k_buf[1, :, :T], rounding)
    for buf in (z_buf, g_buf, k_buf):
        assert buf[0].isnan().all() and buf[1, :, T:].isnan().all()


def test_verify_tuning_names_a_bad_field():
    with pytest.raises(ValueError, match="VerifyTuning: method='chunked', expected blocked, recurrent or split"):
        gdn_triton.VerifyTuning(method="chunked")
    with pytest.raises(ValueError, match="VerifyTuning: split=4, expected 2 or 3 bf16 pieces"):
        gdn_triton.VerifyTuning(method="split", split=4)
    with pytest.raises(ValueError, match="VerifyTuning: solve_dot='bf16', expected ieee or tf32x3"):
        gdn_triton.VerifyTuning(solve_dot="bf16")
    with pytest.raises(ValueError, match="VerifyTuning: key_dot='fp16', expected ieee, tf32x3 or tf32"):
        gdn_triton.VerifyTuning(key_dot="fp16")
    with pytest.raises(ValueError, match="VerifyTuning: late_keys with method 'recurrent', only the split kernel"):
        gdn_triton.VerifyTuning(method="recurrent", late_keys=True)


# ---------------------------------------------------------------------------------------------
# the previous round's commit folded into the next verification (pending=...)
# ---------------------------------------------------------------------------------------------


def _two_rounds_oracle(first: dict, second: dict, accepted: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64, step by step (norms and gates as `gated_oracle`): batch element b runs the first
    accepted[b] tokens of the first round, then every token of the second. Returns the second
    round's o [B, T, HV, dv] and the state after the first round's accepted tokens [B, HV, dv, dk]."""
    outputs, committed = [], []
    for b, m in enumerate(accepted):
        tokens = {n: torch.cat((first[n][b : b + 1, :m], second[n][b : b + 1]), dim=1) for n in "qkvab"}
        joined = dict(first, **tokens, state=first["state"][b : b + 1])
        prefix = dict(joined, **{n: tokens[n][:, :m] for n in "qkvab"})
        o, _, _, _ = gated_oracle(joined)
        outputs.append(o[:, m:])
        committed.append(gated_steps(prefix)[-1])
    return torch.cat(outputs), torch.cat(committed)


def _second_round(first: dict, T2: int, seed: int, dtype=torch.float32, **shape) -> dict:
    """The next round's inputs of the same layer (its A_log, dt_bias)."""
    return dict(raw_inputs(seed, B=2, T=T2, dtype=dtype, **shape), A_log=first["A_log"], dt_bias=first["dt_bias"])


def _first_round(T1: int, seed: int, dtype=torch.float32, raw_keys=False, **shape) -> tuple[dict, tuple]:
    """A first round's inputs and its factors (z, normalised k, g_cum [B, T1, ...]) by the reference;
    raw_keys: (z / |k|, k as given, g_cum)."""
    first = raw_inputs(seed, B=2, T=T1, dtype=dtype, **shape)
    k_out = torch.empty(first["k"].shape, dtype=dtype if raw_keys else torch.float32)
    _, z, g_cum = reference.gdn_verify_gated(**dict(first, state=first["state"].clone()), k_out=k_out,
                                             raw_keys=raw_keys)
    return first, (z.contiguous(), k_out, g_cum.contiguous())


FOLD_CASES = [("split", T1, T2) for T1, T2 in ((3, 5), (16, 16), (16, 1))]
FOLD_CASES += [("recurrent-4x1-prefetch", T1, T2) for T1, T2 in ((2, 2), (16, 4))]
FOLD_CASES += [("recurrent-8x1", 5, 3), ("blocked", 7, 6), ("split", 20, 6)]  # 20: committed by the reference
FOLD_CASES += [("split-late-keys", 3, 5)]


@pytest.mark.parametrize(("variant", "T1", "T2"), FOLD_CASES)
def test_verify_folds_the_pending_commit(variant, T1, T2, monkeypatch):
    """A round with the previous round's factors pending equals running that round's accepted
    tokens (m = T1 in one sequence, 1 in the other) and then this round's, and leaves the committed
    state in place; the factors of this round land in their buffers as without a pending commit.
    Odd first lengths take the factors with raw keys (`raw_keys`), even ones the normalised keys."""
    _with_method(monkeypatch, variant, T2)
    first, (z1, k1, g1) = _first_round(T1, 500 + T1 + T2, raw_keys=T1 % 2 == 1, **SHAPES["grouped"])
    second = _second_round(first, T2, 600 + T1 + T2, **SHAPES["grouped"])
    accepted = [T1, 1]
    o_ref, s_ref = _two_rounds_oracle(first, second, accepted)
    state = first["state"].clone()
    o_alone, z_alone, _ = reference.gdn_verify_gated(**dict(second, state=s_ref.float()))

    o, z, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state),
                                          pending=(z1, k1, g1, torch.tensor(accepted)))

    assert_close("committed state, in place", s_ref, state, FP32_RATIO)
    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z (as verified from the committed state)", z_alone, z, FP32_RATIO)


@pytest.mark.parametrize(("variant", "raw_keys"), [("split", False), ("split", True), ("split-late-keys", True),
                                                   ("recurrent-4x1-prefetch", True)])
def test_verify_folds_bf16_pending_commit(variant, raw_keys, monkeypatch):
    """bf16 projections, as the model has them: the split kernel's fold takes two bf16 pieces of
    the weighted z and k exact in bf16 (raw keys: two products) or in two pieces as well (three),
    so the state is carried to the pieces' precision."""
    T1, T2 = 16, 8
    _with_method(monkeypatch, variant, T2)
    first, (z1, k1, g1) = _first_round(T1, 650, dtype=torch.bfloat16, raw_keys=raw_keys, **SHAPES["grouped"])
    assert k1.dtype == (torch.bfloat16 if raw_keys else torch.float32)
    second = _second_round(first, T2, 660, dtype=torch.bfloat16, **SHAPES["grouped"])
    accepted = [T1 // 2, T1]
    o_ref, s_ref = _two_rounds_oracle(first, second, accepted)
    state = first["state"].clone()

    o, _, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state), pending=(z1, k1, g1, torch.tensor(accepted)))

    assert_close("committed state, in place", s_ref, state,
                 SPLIT_RATIO[2] if variant.startswith("split") else FP32_RATIO)
    assert_close("o (bf16)", o_ref, o, BF16_ROUNDING)


def test_verify_names_a_bad_pending_commit():
    first, (z1, k1, g1) = _first_round(4, 700, **SHAPES["grouped"])
    second = _second_round(first, 3, 701, **SHAPES["grouped"])
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
    first, (z1, k1, g1) = _first_round(6, 710, **SHAPES["ungrouped"])
    second = _second_round(first, 4, 711, **SHAPES["ungrouped"])
    o_ref, s_ref = _two_rounds_oracle(first, second, [2, 6])
    state = first["state"].clone()

    o, _, _ = reference.gdn_verify_gated(**dict(second, state=state), pending=(z1, k1, g1, torch.tensor([2, 6])))

    assert_close("committed state, in place", s_ref, state, FP32_RATIO)
    assert_close("o", o_ref, o, FP32_RATIO)


RAW_ROUND_CASES = [("split", 16, 8, torch.bfloat16), ("split-late-keys", 9, 12, torch.float32),
                   ("recurrent-4x1-prefetch", 4, 3, torch.float32), ("blocked", 6, 5, torch.float32),
                   ("split", 20, 6, torch.float32)]  # 20 tokens: the first round by the reference


@pytest.mark.parametrize(("variant", "T1", "T2", "dtype"), RAW_ROUND_CASES)
def test_rounds_with_raw_key_factors_in_round_buffers(variant, T1, T2, dtype, monkeypatch):
    """The runtime's calls: two rounds writing raw-key factors into slots of round buffers, the
    second folding the first's commit, then the flush (`gdn_commit`) of the second's. The second
    round's outputs and the state after both rounds' accepted tokens equal float64 steps over those
    tokens; k lands bit for bit; nothing outside the slots is written."""
    _with_method(monkeypatch, variant, T2)
    first = raw_inputs(800 + T1, B=2, T=T1, dtype=dtype, **SHAPES["grouped"])
    second = _second_round(first, T2, 810 + T2, dtype=dtype, **SHAPES["grouped"])
    B, _, HK, dk = first["k"].shape
    HV, dv = first["v"].shape[2:]
    T_max = max(T1, T2)
    z_buf, g_buf = torch.full((2, B, T_max, HV, dv), float("nan")), torch.full((2, B, T_max, HV), float("nan"))
    k_buf = torch.full((2, B, T_max, HK, dk), float("nan"), dtype=dtype)
    slots = [dict(z_out=z_buf[s, :, :T], g_out=g_buf[s, :, :T], k_out=k_buf[s, :, :T]) for s, T in ((0, T1), (1, T2))]
    m1, m2 = [T1, 1], [2, T2]
    state = first["state"].clone()

    verify_first = reference.gdn_verify_gated if T1 > gdn_triton.MAX_TOKENS else gdn_triton.gdn_verify_gated
    verify_first(**dict(first, state=state), **slots[0], raw_keys=True)
    pending = (slots[0]["z_out"], slots[0]["k_out"], slots[0]["g_out"], torch.tensor(m1))
    o, _, _ = gdn_triton.gdn_verify_gated(**dict(second, state=state), **slots[1], pending=pending, raw_keys=True)
    gdn_triton.gdn_commit(state[None], *(slots[1][n][None] for n in ("z_out", "k_out", "g_out")), torch.tensor(m2))

    o_ref, _ = _two_rounds_oracle(first, second, m1)
    s_ref = torch.cat([gated_steps(dict(first, state=first["state"][b : b + 1], **{
        n: torch.cat((first[n][b : b + 1, :m1[b]], second[n][b : b + 1, :m2[b]]), dim=1) for n in "qkvab"}))[-1]
        for b in range(B)])
    bf16 = dtype == torch.bfloat16
    assert_close("state after both rounds", s_ref, state, SPLIT_RATIO[2] if bf16 and variant.startswith("split")
                 else FP32_RATIO)
    assert_close("o", o_ref, o, BF16_ROUNDING if bf16 else FP32_RATIO)
    assert torch.equal(k_buf[0, :, :T1], first["k"]) and torch.equal(k_buf[1, :, :T2], second["k"])
    for buf in (z_buf, g_buf, k_buf):
        assert buf[0, :, T1:].isnan().all() and buf[1, :, T2:].isnan().all()


def test_reference_checks_its_outputs_before_the_pending_commit():
    """A bad z_out is named before the pending commit writes the state or k_out is filled."""
    first, (z1, k1, g1) = _first_round(4, 720, raw_keys=True, **SHAPES["grouped"])
    second = _second_round(first, 3, 721, **SHAPES["grouped"])
    state, k_out = first["state"].clone(), torch.full(second["k"].shape, float("nan"))
    z_bad = torch.empty(*second["v"].shape, dtype=torch.bfloat16)
    for raw_keys in (False, True):
        with pytest.raises(ValueError, match=re.escape("gdn_verify_gated: z_out has dtype torch.bfloat16")):
            reference.gdn_verify_gated(**dict(second, state=state), z_out=z_bad, k_out=k_out, raw_keys=raw_keys,
                                       pending=(z1, k1, g1, torch.tensor([4, 2])))
    assert torch.equal(state, first["state"]) and k_out.isnan().all()
