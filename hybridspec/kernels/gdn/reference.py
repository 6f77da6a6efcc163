"""Plain-PyTorch (fp32) reference for Gated DeltaNet verification and state commit (DESIGN A.7).

Per value head and token i (q_i, k_i L2-normalised, decay alpha_i = e^{g_i}, write strength beta_i,
state S in R^{dv x dk}), the gated delta rule is

    z_i = beta_i (v_i - alpha_i S_{i-1} k_i),  S_i = alpha_i S_{i-1} + z_i k_i^T,  o_i = S_i (scale q_i)   (1)

`gdn_recurrent` runs Eq. 1 token by token; it is the oracle the other functions are tested against.

With the cumulative log decay g_i = sum_{j<=i} log alpha_j (called `g_cum` below) Eq. 1 unrolls to

    S_i = e^{g_i} S_0 + sum_{j<=i} e^{g_i - g_j} z_j k_j^T                                        (2)

Substituting (2) for S_{i-1} in the definition of z_i gives one triangular system for all T tokens,

    H Z = diag(beta) (V - diag(e^g) K S_0^T),   H_ii = 1,  H_ij = beta_i e^{g_i - g_j} k_i^T k_j (j < i)  (3)

and the outputs follow without forming any per-token state,

    O = diag(e^g) (scale Q) S_0^T + (Gamma . (scale Q) K^T) Z,   Gamma_ij = e^{g_i - g_j} (j <= i), 0 else  (10)

`gdn_verify` evaluates (3) and (10) block-parallel and returns the compact factors (z_i, k_i, g_i).
H is lower triangular, so the first m rows of Z depend only on the first m tokens: after rejecting
a suffix, `gdn_commit` rebuilds the accepted state of every layer from the same factors by

    S_m = e^{g_m} S_0 + Z_{1:m}^T diag(e^{g_m - g_1}, ..., e^{g_m - g_m}) K_{1:m}                  (7)

Numerics: e^{g_i - g_j} is formed only where j <= i (the exponent is masked to -inf before `exp`,
never a ratio of exponentials), so decays of e.g. g = -50 per token underflow to 0 instead of
overflowing. `g` must be finite (log alpha <= 0). All arithmetic is fp32.

Layouts (value head h reads key head h // (HV // HK), i.e. repeat_interleave semantics):
    q, k   [B, T, HK, dk]      v, z, o   [B, T, HV, dv]      g, beta, g_cum   [B, T, HV]
    state  [B, HV, dv, dk]  (fp32; o_i = S_i (scale q_i))
Internally value heads are split as HV = HK x G (G = HV // HK) so q and k broadcast over the
group dimension instead of being repeated.
"""

import torch
from torch import Tensor

from hybridspec.kernels.gdn.checks import (
    check_commit_inputs,
    check_factor_outputs,
    check_gated_inputs,
    check_pending,
    check_raw_keys,
    check_step_inputs,
)

# ---------------------------------------------------------------------------------------------
# Head grouping: HV = HK x G, value head h = hk * G + group
# ---------------------------------------------------------------------------------------------


def _key_heads(x: Tensor) -> Tensor:
    """[B, T, HK, d] -> [B, HK, 1, T, d] fp32, broadcastable over the group dimension."""
    return x.float().transpose(1, 2).unsqueeze(2)


def _value_heads(x: Tensor, hk: int) -> Tensor:
    """[B, T, HV, *rest] -> [B, HK, G, T, *rest] fp32."""
    B, T, HV = x.shape[:3]
    x = x.float().reshape(B, T, hk, HV // hk, *x.shape[3:])
    return x.permute(0, 2, 3, 1, *range(4, x.dim()))


def _token_major(x: Tensor) -> Tensor:
    """[B, HK, G, T, *rest] -> [B, T, HV, *rest] (inverse of `_value_heads`)."""
    B, HK, G, T = x.shape[:4]
    x = x.permute(0, 3, 1, 2, *range(4, x.dim()))
    return x.reshape(B, T, HK * G, *x.shape[4:])


# ---------------------------------------------------------------------------------------------
# Eq. 1: sequential oracle
# ---------------------------------------------------------------------------------------------


def gdn_recurrent(q, k, v, g, beta, state, scale) -> tuple[Tensor, Tensor]:
    """Sequential recurrence of Eq. 1, token by token. Returns (o, final_state); does not modify `state`.

    q, k [B, T, HK, dk]; v [B, T, HV, dv]; g (log decay), beta [B, T, HV]; state [B, HV, dv, dk]
    fp32. Returns o [B, T, HV, dv] in v.dtype and the state after the last token [B, HV, dv, dk]
    fp32.
    """
    B, T, HK, HV, dk, dv = check_step_inputs("gdn_recurrent", q, k, v, g, beta, state)
    qh, kh = _key_heads(q) * scale, _key_heads(k)  # [B, HK, 1, T, dk]
    vh = _value_heads(v, HK)  # [B, HK, G, T, dv]
    alpha, bh = _value_heads(g, HK).exp(), _value_heads(beta, HK)  # [B, HK, G, T]
    S = state.reshape(B, HK, HV // HK, dv, dk).clone()  # [B, HK, G, dv, dk]
    outputs = []
    for i in range(T):
        k_i, q_i = kh[:, :, :, i, :, None], qh[:, :, :, i, :, None]  # [B, HK, 1, dk, 1]
        a_i, b_i = alpha[..., i, None, None], bh[..., i, None, None]  # [B, HK, G, 1, 1]
        S = a_i * S
        z_i = b_i * (vh[:, :, :, i, :, None] - S @ k_i)  # [B, HK, G, dv, 1]
        S = S + z_i @ k_i.transpose(-1, -2)  # [B, HK, G, dv, dk]
        outputs.append((S @ q_i).squeeze(-1))  # [B, HK, G, dv]
    o = _token_major(torch.stack(outputs, dim=3))  # [B, T, HV, dv]
    return o.to(v.dtype), S.reshape(B, HV, dv, dk)


# ---------------------------------------------------------------------------------------------
# Eqs. 3 and 10: block-parallel verification
# ---------------------------------------------------------------------------------------------


def _causal_decay(g_cum: Tensor, diagonal: int) -> Tensor:
    """Gamma_ij = e^{g_i - g_j} where j <= i - diagonal, else 0.  [..., T] -> [..., T, T].

    The exponent is masked to -inf before `exp`, so positive exponents (j > i) are never
    evaluated and very negative decays underflow to 0 rather than producing inf or NaN.
    """
    T = g_cum.shape[-1]
    causal = torch.ones(T, T, dtype=torch.bool, device=g_cum.device).tril(-diagonal)  # [T, T]
    exponent = g_cum[..., :, None] - g_cum[..., None, :]  # [..., T, T]
    return exponent.masked_fill(~causal, float("-inf")).exp()


def gdn_verify(q, k, v, g, beta, state, scale, *, z_out=None, g_out=None) -> tuple[Tensor, Tensor, Tensor]:
    """Block-parallel verification of T tokens: solve Eq. 3, outputs by Eq. 10.
    Returns (o, z, g_cum): o [B,T,HV,dv] in v.dtype, z [B,T,HV,dv] fp32, g_cum [B,T,HV] fp32 (cumulative log decay).
    The compact factors are (z, k, g_cum); k is the caller's own tensor. Does not modify `state`.

    q, k [B, T, HK, dk] (L2-normalised); v [B, T, HV, dv]; g (log decay <= 0, finite), beta
    [B, T, HV]; state S_0 [B, HV, dv, dk] fp32; scale multiplies q. Any T >= 1. Memory is
    O(T^2 + T (dv + dk)) per head: no per-token state is formed.
    z_out [B, T, HV, dv] fp32 and g_out [B, T, HV] fp32, when given (e.g. slices of the round
    buffers), receive z and g_cum in place and are returned as z and g_cum.
    """
    B, T, HK, HV, dk, dv = check_step_inputs("gdn_verify", q, k, v, g, beta, state)
    check_factor_outputs("gdn_verify", z_out, g_out, (B, T, HV, dv))
    qh, kh = _key_heads(q) * scale, _key_heads(k)  # [B, HK, 1, T, dk]
    vh = _value_heads(v, HK)  # [B, HK, G, T, dv]
    bh = _value_heads(beta, HK)  # [B, HK, G, T]
    g_cum = _value_heads(g, HK).cumsum(dim=-1)  # [B, HK, G, T]
    S0_t = state.reshape(B, HK, HV // HK, dv, dk).transpose(-1, -2)  # [B, HK, G, dk, dv]
    decay_0 = g_cum.exp()[..., None]  # e^{g_i} [B, HK, G, T, 1]

    # Eq. 3: H Z = diag(beta) (V - diag(e^g) K S_0^T)
    kk = kh @ kh.transpose(-1, -2)  # k_i^T k_j [B, HK, 1, T, T]
    eye = torch.eye(T, dtype=torch.float32, device=kk.device)  # [T, T]
    H = eye + bh[..., None] * _causal_decay(g_cum, diagonal=1) * kk  # [B, HK, G, T, T]
    rhs = bh[..., None] * (vh - decay_0 * (kh @ S0_t))  # [B, HK, G, T, dv]
    Z = torch.linalg.solve_triangular(H, rhs, upper=False, unitriangular=True)  # [B, HK, G, T, dv]

    # Eq. 10: O = diag(e^g) Q S_0^T + (Gamma . Q K^T) Z
    qk = qh @ kh.transpose(-1, -2)  # [B, HK, 1, T, T]
    O = decay_0 * (qh @ S0_t) + (_causal_decay(g_cum, diagonal=0) * qk) @ Z  # [B, HK, G, T, dv]

    Z, g_cum = _token_major(Z), _token_major(g_cum)  # [B, T, HV, dv], [B, T, HV]
    if z_out is not None:
        Z = z_out.copy_(Z)
    if g_out is not None:
        g_cum = g_out.copy_(g_cum)
    return _token_major(O).to(v.dtype), Z, g_cum


# ---------------------------------------------------------------------------------------------
# Verification from the raw projections: L2 norms and gates fused in (as the model calls it)
# ---------------------------------------------------------------------------------------------

L2_EPS = 1e-6  # q / sqrt(|q|^2 + eps), as transformers' Qwen3.5 GDN normalises q and k
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above it (torch's and SGLang's default)


def inverse_norms(x: Tensor, eps: float = L2_EPS) -> Tensor:
    """1 / sqrt(sum x^2 + eps) over the last dim, fp32, the dim kept."""
    x = x.float()
    return torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def l2_normalize(x: Tensor, eps: float = L2_EPS) -> Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim, fp32."""
    return x.float() * inverse_norms(x, eps)


def gdn_gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor) -> tuple[Tensor, Tensor]:
    """(g, beta) fp32 [B, T, HV] from the raw gate inputs a, b [B, T, HV] and A_log, dt_bias [HV]:
    g = -exp(A_log) softplus(a + dt_bias) (the log decay), beta = sigmoid(b)."""
    x = a.float() + dt_bias.float()
    g = -A_log.float().exp() * torch.nn.functional.softplus(x, threshold=SOFTPLUS_THRESHOLD)
    return g, torch.sigmoid(b.float())


def gdn_verify_gated(q, k, v, a, b, A_log, dt_bias, state, scale, *, z_out=None, g_out=None,
                     k_out=None, pending=None, raw_keys=False) -> tuple[Tensor, Tensor, Tensor]:
    """`gdn_verify` from the layer's raw projections: q, k [B, T, HK, dk] are L2-normalised here
    (`l2_normalize`) and g, beta formed from a, b [B, T, HV] and A_log, dt_bias [HV] (`gdn_gates`).
    Returns (o, z, g_cum) as `gdn_verify`; k_out [B, T, HK, dk] (any float dtype), when given,
    receives the normalised k, the commit's key factor (the raw k with raw_keys, below).

    raw_keys: the factors are (z_i / |k_i|, k_i) instead of (z_i, k_i / |k_i|) (|k_i| with the
    normalisation's eps): the same outer products, so `gdn_commit` and `pending` take them as they
    are, but k_out then receives k as given (in k's dtype, exact) and z (z_out) the scaled z. With
    bf16 projections the commit's keys are exact bf16 and half the bytes of the normalised fp32 k.

    pending = (z, k, g_cum, accepted), the factors of this layer's previous round [B, T', ...] and
    its m [B] (`check_pending`): that round's commit is applied first, Eq. 7 on `state` in place
    (`gdn_commit` of this one layer), and the round verifies from the committed state. The runtime
    defers each round's commit to the next verification of every layer this way (a commit folded
    into the verify, which reads the state anyway)."""
    B, T, _, HV, _, dv = check_gated_inputs("gdn_verify_gated", q, k, v, a, b, A_log, dt_bias, state, k_out)
    check_factor_outputs("gdn_verify_gated", z_out, g_out, (B, T, HV, dv))  # before any write
    check_raw_keys("gdn_verify_gated", k, k_out, raw_keys)
    if pending is not None:
        check_pending("gdn_verify_gated", state, pending)
        z_p, k_p, g_p, accepted = pending
        gdn_commit(state[None], z_p[None], k_p[None], g_p[None], accepted)
    r_k = inverse_norms(k)  # [B, T, HK, 1]
    k_hat = k.float() * r_k
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    if k_out is not None:
        k_out.copy_(k if raw_keys else k_hat)
    o, z, g_cum = gdn_verify(l2_normalize(q), k_hat, v, g, beta, state, scale, z_out=z_out, g_out=g_out)
    if raw_keys:  # z_i / |k_i|, in place (z_out or the fresh z); value head h reads key head h // G
        z.mul_(r_k.repeat_interleave(v.shape[2] // k.shape[2], dim=2))
    return o, z, g_cum


# ---------------------------------------------------------------------------------------------
# Eq. 7: accepted-state reconstruction for every layer at once
# ---------------------------------------------------------------------------------------------


def gdn_commit(states, z, k, g_cum, accepted) -> None:
    """Rebuild the accepted state of every layer at once, in place, by Eq. 7, accumulating in fp32.

    states [L, B, HV, dv, dk] fp32 holds S_0 of every layer and is overwritten with S_m;
    z [L, B, T, HV, dv], k [L, B, T, HK, dk] (bf16 or fp32) and g_cum [L, B, T, HV] are the
    factors from `gdn_verify`; accepted [B] long is m, the number of committed tokens of batch
    element b (1 <= m <= T, the same for all layers; range-checked only when on the CPU).
    """
    check_commit_inputs(states, z, k, g_cum, accepted)
    L, B, HV, dv, dk = states.shape
    T, HK = z.shape[2], k.shape[3]
    g_cum = g_cum.float()
    last = (accepted - 1).view(1, B, 1, 1).expand(L, B, 1, HV)  # index of token m [L, B, 1, HV]
    g_m = g_cum.gather(dim=2, index=last)  # [L, B, 1, HV]

    # weights e^{g_m - g_j} for j <= m, exactly 0 for the rejected suffix (masked before exp)
    kept = torch.arange(T, device=accepted.device).view(1, T) < accepted.view(B, 1)  # [B, T]
    exponent = (g_m - g_cum).masked_fill(~kept.view(1, B, T, 1), float("-inf"))
    weights = exponent.exp()  # [L, B, T, HV]

    # sum_j e^{g_m - g_j} z_j k_j^T, contracted over tokens: value heads grouped as [HK, G]
    weighted_z = (weights[..., None] * z.float()).view(L, B, T, HK, HV // HK, dv)
    update = torch.einsum("lbtkgv,lbtkd->lbkgvd", weighted_z, k.float())  # [L, B, HK, G, dv, dk]

    states.mul_(g_m.exp().view(L, B, HV, 1, 1))  # e^{g_m} S_0
    states.add_(update.reshape(L, B, HV, dv, dk))


def causal_conv_silu(x: Tensor, state: Tensor, weight: Tensor, *, x_out: Tensor | None = None) -> Tensor:
    """The GDN layer's short causal convolution: x [B, T, C] (the projected q, k, v channels),
    state [B, C, K − 1] (the K − 1 inputs before x), weight [C, 1, K] (depthwise) →
    silu(conv) [B, T, C] contiguous, in x's dtype (the convolution rounded to it before the silu).
    x_out [B, T, C]: also receives a copy of x (the round buffer the commit reads the window from)."""
    if x_out is not None:
        x_out.copy_(x)
    window = torch.cat((state, x.transpose(1, 2)), dim=-1)  # [B, C, K − 1 + T]
    conv = torch.nn.functional.conv1d(window, weight, groups=x.shape[-1])
    return torch.nn.functional.silu(conv).transpose(1, 2).contiguous()
