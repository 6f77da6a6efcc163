"""Argument validation of the GDN ops, shared by `reference.py` and the Triton launchers.

Every error names the function, the argument, what it has and what was expected. Layouts:

    q, k   [B, T, HK, dk]      v, z, o   [B, T, HV, dv]      g, beta, g_cum   [B, T, HV]
    state  [B, HV, dv, dk] fp32         states [L, B, HV, dv, dk] fp32 (the commit)

The first group holds for every implementation; `check_dtype`, `check_layout` and `check_sizes`
are what the Triton kernels need beyond it (T <= MAX_TOKENS, float inputs, a contiguous last dim).
"""

import torch
from torch import Tensor

from hybridspec.kernels.interpreter import check_device

MAX_TOKENS = 16  # the verification window W of the Triton kernels; longer prefill chunks use the reference
MAX_KEY_DIM = 256  # one [BT, BK] key tile per program
INPUT_DTYPES = (torch.bfloat16, torch.float32)


def check_ndim(fn: str, name: str, x: Tensor, layout: str) -> None:
    if x.dim() != len(layout.split(",")):
        raise ValueError(f"{fn}: {name} has {x.dim()} dims, expected [{layout}]")


def check_shape(fn: str, name: str, x: Tensor, layout: str, expected: tuple[int, ...]) -> None:
    if tuple(x.shape) != expected:
        raise ValueError(
            f"{fn}: {name} has shape {tuple(x.shape)}, expected [{layout}] = {expected}"
        )


def check_float32(fn: str, name: str, x: Tensor) -> None:
    if x.dtype != torch.float32:
        raise ValueError(f"{fn}: {name} has dtype {x.dtype}, expected torch.float32")


def check_heads(fn: str, hv: int, hk: int) -> None:
    if hv % hk != 0:
        raise ValueError(f"{fn}: HV={hv} value heads is not a multiple of HK={hk} key heads")


def check_step_inputs(fn, q, k, v, g, beta, state, gate_names=("g", "beta")) -> tuple[int, int, int, int, int, int]:
    """Validate the inputs of `gdn_recurrent` / `gdn_verify` (of `gdn_verify_gated` with its raw
    gates a, b in place of g, beta); return (B, T, HK, HV, dk, dv)."""
    check_ndim(fn, "q", q, "B, T, HK, dk")
    check_ndim(fn, "k", k, "B, T, HK, dk")
    check_ndim(fn, "v", v, "B, T, HV, dv")
    B, T, HK, dk = q.shape
    HV, dv = v.shape[2], v.shape[3]
    if T < 1:
        raise ValueError(f"{fn}: q has T={T} tokens, expected T >= 1")
    check_shape(fn, "k", k, "B, T, HK, dk", (B, T, HK, dk))
    check_shape(fn, "v", v, "B, T, HV, dv", (B, T, HV, dv))
    check_heads(fn, HV, HK)
    check_shape(fn, gate_names[0], g, "B, T, HV", (B, T, HV))
    check_shape(fn, gate_names[1], beta, "B, T, HV", (B, T, HV))
    check_shape(fn, "state", state, "B, HV, dv, dk", (B, HV, dv, dk))
    check_float32(fn, "state", state)
    return B, T, HK, HV, dk, dv


def check_factor_outputs(fn, z_out, g_out, shape: tuple[int, int, int, int]) -> None:
    """Optional in-place outputs of `gdn_verify`: z_out [B, T, HV, dv], g_out [B, T, HV], fp32."""
    for name, out, layout, expected in (("z_out", z_out, "B, T, HV, dv", shape),
                                        ("g_out", g_out, "B, T, HV", shape[:3])):
        if out is not None:
            check_shape(fn, name, out, layout, expected)
            check_float32(fn, name, out)


def check_gated_inputs(fn, q, k, v, a, b, A_log, dt_bias, state, k_out) -> tuple[int, ...]:
    """`check_step_inputs` with the raw gates a, b [B, T, HV], A_log, dt_bias [HV] and k_out."""
    B, T, HK, HV, dk, dv = check_step_inputs(fn, q, k, v, a, b, state, gate_names=("a", "b"))
    check_shape(fn, "A_log", A_log, "HV", (HV,))
    check_shape(fn, "dt_bias", dt_bias, "HV", (HV,))
    if k_out is not None:
        check_shape(fn, "k_out", k_out, "B, T, HK, dk", (B, T, HK, dk))
    return B, T, HK, HV, dk, dv


def check_raw_keys(fn: str, k: Tensor, k_out: Tensor | None, raw_keys: bool) -> None:
    """raw_keys stores k as given: k_out must hold it exactly (the same dtype)."""
    if raw_keys and k_out is not None and k_out.dtype != k.dtype:
        raise ValueError(f"{fn}: raw_keys stores k as given, but k_out has dtype {k_out.dtype} and k {k.dtype}")


def check_commit_inputs(states, z, k, g_cum, accepted) -> None:
    """`gdn_commit`'s arguments: states [L, B, HV, dv, dk] fp32, z [L, B, T, HV, dv],
    k [L, B, T, HK, dk], g_cum [L, B, T, HV], accepted [B] long with 1 <= m <= T."""
    fn = "gdn_commit"
    check_ndim(fn, "states", states, "L, B, HV, dv, dk")
    check_ndim(fn, "z", z, "L, B, T, HV, dv")
    check_ndim(fn, "k", k, "L, B, T, HK, dk")
    check_float32(fn, "states", states)
    L, B, HV, dv, dk = states.shape
    T, HK = z.shape[2], k.shape[3]
    check_shape(fn, "z", z, "L, B, T, HV, dv", (L, B, T, HV, dv))
    check_shape(fn, "k", k, "L, B, T, HK, dk", (L, B, T, HK, dk))
    check_heads(fn, HV, HK)
    check_shape(fn, "g_cum", g_cum, "L, B, T, HV", (L, B, T, HV))
    check_shape(fn, "accepted", accepted, "B", (B,))
    if accepted.dtype != torch.long:
        raise ValueError(f"gdn_commit: accepted has dtype {accepted.dtype}, expected torch.long")
    # The range check reads the values, which is only free when they already live on the host.
    if accepted.device.type == "cpu" and not bool(((accepted >= 1) & (accepted <= T)).all()):
        raise ValueError(f"gdn_commit: accepted = {accepted.tolist()}, expected 1 <= m <= T={T}")


def check_pending(fn: str, state: Tensor, pending) -> None:
    """A deferred commit of one layer: (z [B, T', HV, dv], k [B, T', HK, dk], g_cum [B, T', HV],
    accepted [B] long) against its state [B, HV, dv, dk]."""
    if not isinstance(pending, tuple | list) or len(pending) != 4:
        raise ValueError(f"{fn}: pending must be (z, k, g_cum, accepted), got {type(pending).__name__}")
    z, k, g_cum, accepted = pending
    try:
        check_commit_inputs(state[None], z[None], k[None], g_cum[None], accepted)
    except ValueError as error:
        raise ValueError(f"{fn}: pending commit: {str(error).removeprefix('gdn_commit: ')}") from None


# ---------------------------------------------------------------------------------------------
# What the Triton kernels need beyond the shapes
# ---------------------------------------------------------------------------------------------


def check_dtype(fn: str, name: str, x: Tensor, allowed: tuple[torch.dtype, ...]) -> None:
    if x.dtype not in allowed:
        raise ValueError(f"{fn}: {name} has dtype {x.dtype}, expected one of {list(allowed)}")


def check_layout(fn: str, tensors: dict[str, Tensor]) -> None:
    """Same device for all (CUDA, or CPU when the kernels are interpreted); last dim contiguous."""
    check_device(fn, **tensors)
    for name, x in tensors.items():
        if x.shape[-1] > 1 and x.stride(-1) != 1:
            raise ValueError(f"{fn}: {name} has strides {tuple(x.stride())}, "
                             "expected a contiguous last dimension (stride 1)")


def check_sizes(fn: str, T: int, dk: int) -> None:
    if T > MAX_TOKENS:
        raise ValueError(f"{fn}: T={T} tokens, the Triton kernels take at most {MAX_TOKENS} "
                         "(use the reference for longer prefill chunks)")
    if dk > MAX_KEY_DIM:
        raise ValueError(f"{fn}: dk={dk}, the Triton kernels take at most {MAX_KEY_DIM}")
