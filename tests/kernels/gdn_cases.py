"""Inputs, tolerances and launch tables shared by the Triton GDN kernel tests (test_gdn_triton*.py)."""

import dataclasses

import torch
import torch.nn.functional as F

from hybridspec.kernels.gdn import reference
from hybridspec.kernels.gdn.checks import MAX_TOKENS
from hybridspec.kernels.gdn.tuning import RECURRENT as SHIPPED_RECURRENT
from hybridspec.kernels.gdn.tuning import SHIPPED, SPLIT, Tuning, VerifyTuning
from tests.kernels.test_gdn_reference import REGIMES, gated_oracle, gated_steps, make_inputs, raw_inputs
from tests.tolerance import assert_close

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
# S_0 in two bf16 pieces carries 2^-16 of it relative under the interpreter, which truncates when it
# narrows to bf16 (2^-18 on a GPU, which rounds to nearest)
PIECES_RATIO = 2**-15

# the shipped kernels with other program shapes: the interpreter's cost is per program, so the
# 32-row blocks keep CI short; the one-warp shapes (4 rows, shipped, and 8) at a few lengths. The
# shipped launches read the state before their PDL wait (early_state); the others after it, so the
# tests trace both orders (the interpreter runs no PDL: the results are the same)
RECURRENT = {"recurrent-32x4": VerifyTuning(method="recurrent", block_v=32, num_warps=4),
             "recurrent-8x1": VerifyTuning(method="recurrent", block_v=8, num_warps=1),
             "recurrent-4x1": SHIPPED_RECURRENT}
METHODS = {"split": SPLIT, "split-late-keys": dataclasses.replace(SPLIT, late_keys=True),
           "split-state-after-wait": dataclasses.replace(SPLIT, early_state=False), **RECURRENT}


def verify_table(variant: str = "split") -> Tuning:
    """The shipped table with one verify launch (METHODS[variant]) at every length: the tests that
    name no variant run the split kernel at every T (the shipped choice per length runs end to end
    in tests/runtime/test_triton_backend.py)."""
    return SHIPPED.replace(verify={T: METHODS[variant] for T in range(1, MAX_TOKENS + 1)})


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


def bf16_gates(inputs: dict) -> tuple[dict, dict]:
    """(inputs with bf16 g, beta; the same values widened to fp32 for the reference)."""
    inputs = dict(inputs, g=inputs["g"].bfloat16(), beta=inputs["beta"].bfloat16())
    return inputs, dict(inputs, **{name: inputs[name].float() for name in ("q", "k", "v", "g", "beta")})


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


def two_rounds_oracle(first: dict, second: dict, accepted: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
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


def second_round(first: dict, T2: int, seed: int, dtype=torch.float32, **shape) -> dict:
    """The next round's inputs of the same layer (its A_log, dt_bias)."""
    return dict(raw_inputs(seed, B=2, T=T2, dtype=dtype, **shape), A_log=first["A_log"], dt_bias=first["dt_bias"])


def first_round(T1: int, seed: int, dtype=torch.float32, raw_keys=False, **shape) -> tuple[dict, tuple]:
    """A first round's inputs and its factors (z, normalised k, g_cum [B, T1, ...]) by the reference;
    raw_keys: (z / |k|, k as given, g_cum)."""
    first = raw_inputs(seed, B=2, T=T1, dtype=dtype, **shape)
    k_out = torch.empty(first["k"].shape, dtype=dtype if raw_keys else torch.float32)
    _, z, g_cum = reference.gdn_verify_gated(**dict(first, state=first["state"].clone()), k_out=k_out,
                                             raw_keys=raw_keys)
    return first, (z.contiguous(), k_out, g_cum.contiguous())


def check_verify(verify, inputs: dict, tuning: Tuning) -> None:
    """verify(**inputs, tuning=tuning) (a `gdn_verify`) against the reference: o, z and g_cum in
    fp32 to FP32_RATIO, its state argument left as it was."""
    state_before = inputs["state"].clone()
    o_ref, z_ref, g_ref = reference.gdn_verify(**inputs)

    o, z, g_cum = verify(**inputs, tuning=tuning)

    assert o.dtype == z.dtype == g_cum.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert torch.equal(inputs["state"], state_before), "gdn_verify modified its state argument"


def check_gated_verify(verify_gated, inputs: dict, tuning: Tuning) -> None:
    """verify_gated(**inputs, k_out=..., tuning=tuning) (a `gdn_verify_gated` on fp32 raw
    projections) against the float64 oracle: o, z, g_cum and the normalised k to FP32_RATIO."""
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    k_out = torch.full(inputs["k"].shape, float("nan"))

    o, z, g_cum = verify_gated(**inputs, k_out=k_out, tuning=tuning)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert_close("k_out", k_ref, k_out, FP32_RATIO)


def round_buffers(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NaN-filled round buffers [L = 2, B, T_max = 16, ...] for these inputs: z [.., HV, dv] and
    g_cum [.., HV] in fp32, k [.., HK, dk] in bf16; a test writes slot 1's first T tokens."""
    B, _, HK, dk = inputs["k"].shape
    HV, dv = inputs["v"].shape[2:]
    z_buf, g_buf = torch.full((2, B, 16, HV, dv), float("nan")), torch.full((2, B, 16, HV), float("nan"))
    return z_buf, g_buf, torch.full((2, B, 16, HK, dk), float("nan"), dtype=torch.bfloat16)


def assert_slices_only(T: int, *buffers: torch.Tensor) -> None:
    """Nothing outside slot 1's first T tokens of each round buffer (`round_buffers`) was written."""
    for buf in buffers:
        assert buf[0].isnan().all() and buf[1, :, T:].isnan().all(), "a kernel wrote outside its slice"
