"""The GDN benchmarks' setting and inputs: the 30 GDN layers of Qwen3.6-35B-A3B, one round's inputs
(`Problem`, `make_problem`), the float64 oracle of Eq. 1 and the copy-bandwidth floor of a round.
Used by bench/kernels/gdn_kernels.py (its docstring gives the setting and the floor's bytes) and
the GDN sweeps beside it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ROTATIONS = 4  # input sets / state pools per graph
T_MAX = 16  # round-buffer length of the runtime (the verification window W)
REPLAYSSM_RING = 16  # SGLang's default --linear-replayssm-cache-len
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 5e-3}


@dataclass(frozen=True)
class Setting:
    layers: int = 30
    value_heads: int = 32
    key_heads: int = 16
    key_dim: int = 128
    value_dim: int = 128

    @property
    def state_bytes(self) -> int:  # one fp32 state of every layer
        return self.layers * self.value_heads * self.value_dim * self.key_dim * 4

    @property
    def token_bytes(self) -> int:  # inputs and outputs of one token in every layer, bf16
        HK, HV, dk, dv = self.key_heads, self.value_heads, self.key_dim, self.value_dim
        return self.layers * 2 * (2 * HK * dk + 2 * HV * dv + 2 * HV)


QWEN36 = Setting()


@dataclass
class Problem:
    """One input set of a round: the 30 layers' inputs and their states before the round."""

    q: Tensor  # [L, 1, w, HK, dk] L2-normalised, activation dtype
    k: Tensor  # [L, 1, w, HK, dk]
    v: Tensor  # [L, 1, w, HV, dv]
    a: Tensor  # [L, w, HV] raw decay input: g = -exp(A_log) softplus(a + dt_bias)
    b: Tensor  # [L, w, HV] raw write strength: beta = sigmoid(b)
    A_log: Tensor  # [L, HV] fp32
    dt_bias: Tensor  # [L, HV] fp32
    g: Tensor  # [L, 1, w, HV] fp32, the gates precomputed for hybridspec and fla
    beta: Tensor  # [L, 1, w, HV] fp32
    state: Tensor  # [L, 1, HV, dv, dk] fp32 S_0

    @property
    def scale(self) -> float:
        return self.q.shape[-1] ** -0.5


def gates(a: Tensor, b: Tensor, A_log: Tensor, dt_bias: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """SGLang's GDN gating in `dtype`: g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)."""
    a, b = a.to(dtype), b.to(dtype)  # [L, w, HV]
    g = -A_log.to(dtype)[:, None].exp() * F.softplus(a + dt_bias.to(dtype)[:, None])
    return g, torch.sigmoid(b)


def make_problem(s: Setting, w: int, dtype: torch.dtype, seed: int, device) -> Problem:
    gen = torch.Generator(device=device).manual_seed(seed)
    L, HK, HV, dk, dv = s.layers, s.key_heads, s.value_heads, s.key_dim, s.value_dim

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=device)

    q = F.normalize(randn(L, 1, w, HK, dk), dim=-1).to(dtype)
    k = F.normalize(randn(L, 1, w, HK, dk), dim=-1).to(dtype)
    v = randn(L, 1, w, HV, dv).to(dtype)
    a, b = randn(L, w, HV).to(dtype), randn(L, w, HV).to(dtype)
    A_log = (1 + 15 * rand(L, HV)).log()  # A in (1, 16), as Mamba / Qwen3-Next initialise it
    dt_bias = torch.expm1(1e-3 + 0.1 * rand(L, HV)).log()  # softplus(dt_bias) in (1e-3, 0.1)
    g, beta = gates(a, b, A_log, dt_bias, torch.float32)
    state = 0.1 * randn(L, 1, HV, dv, dk)
    return Problem(q, k, v, a, b, A_log, dt_bias, g[:, None], beta[:, None], state)


def oracle(p: Problem, m: int) -> tuple[Tensor, Tensor]:
    """Eq. 1 token by token in float64: o [L, w, HV, dv] and the state after m tokens [L, HV, dv, dk]."""
    group = p.v.shape[3] // p.q.shape[3]
    q = p.q[:, 0].double().repeat_interleave(group, dim=2) * p.scale  # [L, w, HV, dk]
    k = p.k[:, 0].double().repeat_interleave(group, dim=2)  # [L, w, HV, dk]
    v = p.v[:, 0].double()  # [L, w, HV, dv]
    g, beta = gates(p.a, p.b, p.A_log, p.dt_bias, torch.float64)  # [L, w, HV]
    S, S_m, outputs = p.state[:, 0].double(), None, []  # [L, HV, dv, dk]
    for i in range(q.shape[1]):
        S = g[:, i, :, None, None].exp() * S
        z = beta[:, i, :, None] * (v[:, i] - torch.einsum("lhvd,lhd->lhv", S, k[:, i]))
        S = S + z[..., None] * k[:, i, :, None, :]
        outputs.append(torch.einsum("lhvd,lhd->lhv", S, q[:, i]))
        S_m = S if i == m - 1 else S_m
    return torch.stack(outputs, dim=1), S_m


def relative_error(got: Tensor, ref: Tensor) -> float:
    got = got.double()
    if not torch.isfinite(got).all():
        return math.inf
    return ((got - ref).norm() / ref.norm()).item()


def floor_us(setting: Setting, w: int, bandwidth: float) -> float:
    return (2 * setting.state_bytes + w * setting.token_bytes) / bandwidth * 1e6
