"""The block-parallel GDN verifier (Eqs. 3, 10) and the commit (Eq. 7) against the recurrence (Eq. 1)."""

import re

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from hybridspec.kernels.gdn import gdn_commit, gdn_recurrent, gdn_verify, gdn_verify_gated
from tests.tolerance import assert_close

# awkward sizes: grouped value heads (HV = 2 HK) and plain multi-head (HV = HK)
SHAPES = {
    "grouped": dict(B=2, HK=3, HV=6, dk=12, dv=20),
    "ungrouped": dict(B=1, HK=2, HV=2, dk=7, dv=9),
}
REGIMES = ("ordinary", "near_zero", "near_one")
FP32_RATIO = 1e-5



def _seed(*parts: int) -> int:
    return sum(p * 1000**i for i, p in enumerate(parts))


def _log_decay(regime: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Per-token log alpha: ordinary (alpha ~ 0.3..0.99), alpha ~ 0 (g in -60..-20), alpha ~ 1."""
    if regime == "ordinary":
        return F.logsigmoid(torch.randn(shape, generator=gen) + 1.0)
    if regime == "near_zero":
        return -20.0 - 40.0 * torch.rand(shape, generator=gen)
    if regime == "near_one":
        return -1e-6 * torch.rand(shape, generator=gen)
    raise ValueError(regime)


def make_inputs(seed, B, T, HK, HV, dk, dv, regime="ordinary", dtype=torch.float32) -> dict:
    """Fresh random arguments of gdn_recurrent / gdn_verify (q, k L2-normalised, state fp32)."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, HK, dk, generator=gen), dim=-1)  # [B, T, HK, dk]
    k = F.normalize(torch.randn(B, T, HK, dk, generator=gen), dim=-1)  # [B, T, HK, dk]
    v = torch.randn(B, T, HV, dv, generator=gen)  # [B, T, HV, dv]
    beta = 0.01 + 0.98 * torch.rand(B, T, HV, generator=gen)  # [B, T, HV] in (0, 1)
    g = _log_decay(regime, (B, T, HV), gen)  # [B, T, HV]
    state = torch.randn(B, HV, dv, dk, generator=gen)  # [B, HV, dv, dk]
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta, state=state,
                scale=dk**-0.5)


def raw_inputs(seed, B, T, HK, HV, dk, dv, dtype=torch.float32, a_range=(-6.0, 3.0)) -> dict:
    """Arguments of gdn_verify_gated as a model layer has them: q, k of norms 0.3..5 (not
    normalised), a uniform over a_range, b over -6..6, A_log and dt_bias per value head.
    a_range=(-30, 30) mixes decays of ~1 and ~0 within a sequence and crosses softplus's
    threshold of 20: there Eq. 10 in fp32 loses ~1e-5 against the recurrence (a property of the
    block-parallel form, not of the gates), so that range is used to check the gates alone."""
    gen = torch.Generator().manual_seed(seed)
    norms = lambda: 0.3 + 4.7 * torch.rand(B, T, HK, 1, generator=gen)  # noqa: E731
    q = F.normalize(torch.randn(B, T, HK, dk, generator=gen), dim=-1) * norms()
    k = F.normalize(torch.randn(B, T, HK, dk, generator=gen), dim=-1) * norms()
    v = torch.randn(B, T, HV, dv, generator=gen)
    a = a_range[0] + (a_range[1] - a_range[0]) * torch.rand(B, T, HV, generator=gen)
    b = -6.0 + 12.0 * torch.rand(B, T, HV, generator=gen)
    A_log = (1 + 15 * torch.rand(HV, generator=gen)).log()
    dt_bias = torch.expm1(1e-3 + 0.1 * torch.rand(HV, generator=gen)).log()
    state = torch.randn(B, HV, dv, dk, generator=gen)
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), a=a.to(dtype), b=b.to(dtype), A_log=A_log,
                dt_bias=dt_bias, state=state, scale=dk**-0.5)


def gated_oracle(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(o, z, g_cum, k_hat) of gdn_verify_gated, all in float64: norms, gates, Eq. 1 step by step."""
    return gated_steps(inputs)[:4]


def gated_steps(inputs: dict) -> tuple[torch.Tensor, ...]:
    """`gated_oracle`'s (o, z, g_cum, k_hat) and the state after the last token [B, HV, dv, dk]."""
    q, k = (inputs[n].double() for n in "qk")
    q_hat, k_hat = (x / (x * x).sum(-1, keepdim=True).add(1e-6).sqrt() for x in (q, k))
    x = inputs["a"].double() + inputs["dt_bias"].double()
    g = -inputs["A_log"].double().exp() * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    beta = torch.sigmoid(inputs["b"].double())
    group = inputs["v"].shape[2] // q.shape[2]
    q_v, k_v = (x.repeat_interleave(group, dim=2) for x in (q_hat * inputs["scale"], k_hat))  # [B, T, HV, dk]
    S, v, outputs, zs = inputs["state"].double(), inputs["v"].double(), [], []
    for i in range(q.shape[1]):
        S = g[:, i, :, None, None].exp() * S
        zs.append(beta[:, i, :, None] * (v[:, i] - torch.einsum("bhvd,bhd->bhv", S, k_v[:, i])))
        S = S + zs[-1][..., None] * k_v[:, i, :, None, :]
        outputs.append(torch.einsum("bhvd,bhd->bhv", S, q_v[:, i]))
    return torch.stack(outputs, 1), torch.stack(zs, 1), g.cumsum(1), k_hat, S


def recurrent_prefix(inputs: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run Eq. 1 one token at a time (inputs cast to fp32).

    Returns o [B, T, HV, dv], the states S_0..S_T [T+1, B, HV, dv, dk] and
    z_i = beta_i (v_i - alpha_i S_{i-1} k_i) [B, T, HV, dv].
    """
    q, k, v = (inputs[n].float() for n in "qkv")
    g, beta, S, scale = inputs["g"], inputs["beta"], inputs["state"], inputs["scale"]
    k_v = k.repeat_interleave(v.shape[2] // k.shape[2], dim=2)  # key of each value head [B, T, HV, dk]
    outputs, states, zs = [], [S], []
    for i in range(q.shape[1]):
        step = slice(i, i + 1)
        Sk = torch.einsum("bhvd,bhd->bhv", S, k_v[:, i])  # S_{i-1} k_i [B, HV, dv]
        zs.append(beta[:, i, :, None] * (v[:, i] - g[:, i, :, None].exp() * Sk))
        o, S = gdn_recurrent(q[:, step], k[:, step], v[:, step], g[:, step], beta[:, step], S, scale)
        outputs.append(o)
        states.append(S)
    return torch.cat(outputs, dim=1), torch.stack(states), torch.stack(zs, dim=1)


# ---------------------------------------------------------------------------------------------
# the oracle itself
# ---------------------------------------------------------------------------------------------


def test_recurrent_matches_per_head_loop():
    """gdn_recurrent equals Eq. 1 written per (batch, value head), with key head h // (HV // HK)."""
    inputs = make_inputs(1, B=2, T=5, HK=3, HV=6, dk=12, dv=20)
    q, k, v, g, beta, S0, scale = (inputs[n] for n in ("q", "k", "v", "g", "beta", "state", "scale"))
    state_before = S0.clone()
    o, S_final = gdn_recurrent(**inputs)

    o_ref, S_ref = torch.zeros_like(o), S0.clone()
    for b in range(2):
        for h in range(6):
            hk = h // 2
            S = S_ref[b, h]  # [dv, dk]
            for i in range(5):
                alpha = g[b, i, h].exp()
                z = beta[b, i, h] * (v[b, i, h] - alpha * S @ k[b, i, hk])  # [dv]
                S = alpha * S + torch.outer(z, k[b, i, hk])
                o_ref[b, i, h] = S @ (scale * q[b, i, hk])
            S_ref[b, h] = S
    assert_close("o", o_ref, o, 1e-6)
    assert_close("state", S_ref, S_final, 1e-6)
    assert torch.equal(S0, state_before), "gdn_recurrent modified its state argument"


# ---------------------------------------------------------------------------------------------
# Eqs. 3 and 10
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("T", range(1, 17))
@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("shape", SHAPES)
def test_verify_matches_recurrence(shape, regime, T):
    inputs = make_inputs(_seed(T, REGIMES.index(regime), list(SHAPES).index(shape)),
                         T=T, regime=regime, **SHAPES[shape])
    state_before = inputs["state"].clone()
    o_ref, _, z_ref = recurrent_prefix(inputs)

    o, z, g_cum = gdn_verify(**inputs)

    assert o.dtype == torch.float32 and z.dtype == torch.float32 and g_cum.dtype == torch.float32
    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", inputs["g"].double().cumsum(dim=1), g_cum, FP32_RATIO)
    assert torch.equal(inputs["state"], state_before), "gdn_verify modified its state argument"


@pytest.mark.parametrize("T", [63, 64])
@pytest.mark.parametrize("regime", REGIMES)
def test_prefill_chunks_match_recurrence(regime, T):
    """Chunks of up to 64 tokens: outputs and the state after the whole chunk."""
    inputs = make_inputs(_seed(T, REGIMES.index(regime), 7), T=T, regime=regime,
                         **SHAPES["grouped"])
    o_ref, S_ref = gdn_recurrent(**inputs)

    o, z, g_cum = gdn_verify(**inputs)
    states = inputs["state"][None].clone()  # [1, B, HV, dv, dk]
    all_tokens = torch.full((inputs["q"].shape[0],), T, dtype=torch.long)
    gdn_commit(states, z[None], inputs["k"][None], g_cum[None], all_tokens)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("state", S_ref, states[0], FP32_RATIO)


# ---------------------------------------------------------------------------------------------
# Eq. 7
# ---------------------------------------------------------------------------------------------


def _verify_layers(T: int, regime: str, accepted: torch.Tensor, layers: int = 3) -> tuple:
    """Verify `layers` independent GDN layers on B = len(accepted) sequences of T tokens.

    Returns the stacked factors (S_0 [L, B, HV, dv, dk], z, k, g_cum) and the expected
    committed states S_m [L, B, HV, dv, dk] from the recurrence, m = accepted[b].
    """
    shape = dict(SHAPES["grouped"], B=len(accepted))
    S0s, zs, ks, g_cums, expected = [], [], [], [], []
    for layer in range(layers):
        inputs = make_inputs(_seed(T, REGIMES.index(regime), 20 + layer), T=T, regime=regime,
                             **shape)
        _, prefix_states, _ = recurrent_prefix(inputs)  # [T+1, B, HV, dv, dk]
        _, z, g_cum = gdn_verify(**inputs)
        S0s.append(inputs["state"])
        zs.append(z)
        ks.append(inputs["k"])
        g_cums.append(g_cum)
        expected.append(prefix_states[accepted, torch.arange(len(accepted))])  # [B, HV, dv, dk]
    stack = torch.stack
    return stack(S0s), stack(zs), stack(ks), stack(g_cums), stack(expected)


@pytest.mark.parametrize("T", range(1, 17))
@pytest.mark.parametrize("regime", REGIMES)
def test_commit_matches_recurrent_state(regime, T):
    """Every m in 1..T at once: batch element b commits m = accepted[b] tokens, in 3 layers."""
    gen = torch.Generator().manual_seed(T)
    accepted = torch.randperm(T, generator=gen) + 1  # [B = T], every m once, in shuffled order
    states, z, k, g_cum, expected = _verify_layers(T, regime, accepted)

    gdn_commit(states, z, k, g_cum, accepted)

    for layer in range(3):
        assert_close(f"state[layer {layer}]", expected[layer], states[layer], FP32_RATIO)


# ---------------------------------------------------------------------------------------------
# bf16 inputs
# ---------------------------------------------------------------------------------------------


def test_bf16_inputs_match_recurrence_on_rounded_inputs():
    T, shape = 12, SHAPES["grouped"]
    inputs = make_inputs(5, T=T, dtype=torch.bfloat16, **shape)
    o_ref, prefix_states, z_ref = recurrent_prefix(inputs)  # fp32 on the bf16-rounded inputs

    o, z, g_cum = gdn_verify(**inputs)

    assert o.dtype == torch.bfloat16 and z.dtype == torch.float32
    assert_close("o (bf16)", o_ref, o, 1e-2)
    assert_close("z", z_ref, z, FP32_RATIO)

    accepted = torch.tensor([T, 5])
    expected = prefix_states[accepted, torch.arange(shape["B"])]  # [B, HV, dv, dk]
    for z_dtype, ratio in [(torch.float32, FP32_RATIO), (torch.bfloat16, 1e-2)]:
        states = inputs["state"][None].clone()
        gdn_commit(states, z[None].to(z_dtype), inputs["k"][None], g_cum[None], accepted)
        assert_close(f"state (z {z_dtype})", expected, states[0], ratio)


# ---------------------------------------------------------------------------------------------
# memory: compact factors only
# ---------------------------------------------------------------------------------------------


def _largest_allocation(fn) -> int:
    """Bytes of the largest allocation any single op makes (self memory) while `fn` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.self_cpu_memory_usage for e in prof.events()), default=0)


@pytest.mark.parametrize("T", [1, 5, 16])
@pytest.mark.parametrize("shape", SHAPES)
def test_gated_verify_forms_norms_and_gates_like_the_model(shape, T):
    inputs = raw_inputs(_seed(7, T), T=T, **SHAPES[shape])
    o_ref, z_ref, g_ref, k_ref = gated_oracle(inputs)
    k_out = torch.full(inputs["k"].shape, float("nan"))

    o, z, g_cum = gdn_verify_gated(**inputs, k_out=k_out)

    assert_close("o", o_ref, o, FP32_RATIO)
    assert_close("z", z_ref, z, FP32_RATIO)
    assert_close("g_cum", g_ref, g_cum, FP32_RATIO)
    assert_close("k_out", k_ref, k_out, FP32_RATIO)


def test_gates_across_decay_extremes_and_the_softplus_threshold():
    """With T = 1, g_cum is the gate itself: each entry to fp32 accuracy, from a + dt_bias = -30
    (decay ~ 1, softplus ~ 1e-13) through the threshold of 20 to 30 (decay ~ 0)."""
    inputs = raw_inputs(_seed(8), B=64, T=1, HK=2, HV=8, dk=8, dv=8, a_range=(-30.0, 30.0))
    _, _, g_ref, _ = gated_oracle(inputs)

    _, _, g_cum = gdn_verify_gated(**inputs)

    relative = ((g_cum.double() - g_ref) / g_ref).abs().max().item()
    # a + dt_bias rounds to fp32 first: near |x| = 30 one ulp is 2e-6, and softplus ~ e^x inherits it
    assert relative < FP32_RATIO, f"worst relative error of g: {relative:.2e}"
    x = inputs["a"] + inputs["dt_bias"]
    assert (x > 20).any() and (x < -20).any() and ((x > 19) & (x < 21)).any()


def test_no_per_token_state_buffer():
    """A [T, HV, dv, dk] buffer would dwarf every legitimate allocation at these sizes."""
    T, HV, dv, dk, layers = 16, 2, 64, 64, 2
    inputs = make_inputs(9, B=1, T=T, HK=HV, HV=HV, dk=dk, dv=dv)
    per_token_states = T * HV * dv * dk * 4  # bytes
    o, z, g_cum = gdn_verify(**inputs)

    largest = _largest_allocation(lambda: gdn_verify(**inputs))
    assert largest >= o.nbytes, f"profiler saw no allocation as large as o ({largest} B)"
    assert largest < per_token_states / 2, f"gdn_verify allocated {largest} B in one op"

    states = inputs["state"][None].repeat(layers, 1, 1, 1, 1)  # [L, 1, HV, dv, dk]
    factors = (z[None].repeat(layers, 1, 1, 1, 1), inputs["k"][None].repeat(layers, 1, 1, 1, 1),
               g_cum[None].repeat(layers, 1, 1, 1))
    largest = _largest_allocation(lambda: gdn_commit(states, *factors, torch.tensor([T - 3])))
    assert largest >= states[0].nbytes, f"profiler saw no state-sized allocation ({largest} B)"
    assert largest < per_token_states / 2, f"gdn_commit allocated {largest} B in one op"


# ---------------------------------------------------------------------------------------------
# boundary errors
# ---------------------------------------------------------------------------------------------

STEP_ERRORS = {
    "v has 3 dims": lambda a: a.update(v=a["v"][..., 0]),
    "k has shape": lambda a: a.update(k=a["k"][:, :-1]),
    "HV=5 value heads is not a multiple of HK=3": lambda a: a.update(
        v=a["v"][:, :, :5], g=a["g"][:, :, :5], beta=a["beta"][:, :, :5], state=a["state"][:, :5]),
    "g has shape": lambda a: a.update(g=a["g"][:, :, :-1]),
    "beta has shape": lambda a: a.update(beta=a["beta"][None]),
    "state has shape": lambda a: a.update(state=a["state"][..., :-1]),
    "state has dtype": lambda a: a.update(state=a["state"].bfloat16()),
}


@pytest.mark.parametrize("fn", [gdn_verify, gdn_recurrent], ids=lambda f: f.__name__)
@pytest.mark.parametrize("message", STEP_ERRORS)
def test_step_rejects_bad_argument(fn, message):
    inputs = make_inputs(0, T=3, **SHAPES["grouped"])
    STEP_ERRORS[message](inputs)
    with pytest.raises(ValueError, match=re.escape(f"{fn.__name__}: {message}")):
        fn(**inputs)


COMMIT_ERRORS = {
    "states has 4 dims": lambda a: a.update(states=a["states"][0]),
    "states has dtype": lambda a: a.update(states=a["states"].double()),
    "z has shape": lambda a: a.update(z=a["z"][:, :, :, :, :-1]),
    "k has shape": lambda a: a.update(k=a["k"][..., :-1]),
    "g_cum has shape": lambda a: a.update(g_cum=a["g_cum"][:, :, :-1]),
    "accepted has shape": lambda a: a.update(accepted=a["accepted"][:1]),
    "accepted has dtype": lambda a: a.update(accepted=a["accepted"].int()),
    "accepted = [0, 2]": lambda a: a.update(accepted=torch.tensor([0, 2])),
    "accepted = [1, 4]": lambda a: a.update(accepted=torch.tensor([1, 4])),
}


@pytest.mark.parametrize("message", COMMIT_ERRORS)
def test_commit_rejects_bad_argument(message):
    inputs = make_inputs(0, T=3, **SHAPES["grouped"])
    _, z, g_cum = gdn_verify(**inputs)
    args = dict(states=inputs["state"][None].clone(), z=z[None], k=inputs["k"][None],
                g_cum=g_cum[None], accepted=torch.tensor([1, 3]))
    COMMIT_ERRORS[message](args)
    with pytest.raises(ValueError, match=re.escape(f"gdn_commit: {message}")):
        gdn_commit(**args)
