"""Triton kernels for GDN verification (Eqs. 3, 10) and the all-layer commit (Eq. 7), DESIGN A.7.

Same signatures, layouts and semantics as `reference.py` (read its docstring for the maths), plus
a keyword-only `tuning` (`tuning.SHIPPED` by default) that picks each length's kernel and launch:

    q, k   [B, T, HK, dk]      v, o, z   [B, T, HV, dv]      g, beta, g_cum   [B, T, HV]
    state  [B, HV, dv, dk] fp32 (o_i = S_i (scale q_i));  value head h reads key head h // (HV // HK)

Verification runs `verify_recurrent` (forward substitution, short windows) or `verify_split`
(the blocked form by 16 x 16 products) for T <= MAX_TOKENS; the commit runs `commit`. Inputs (bf16
or fp32) are widened to fp32 on load; states and factors z, g_cum are fp32. The kernels run on CUDA
tensors, or on CPU tensors when TRITON_INTERPRET=1 was set before triton was imported.
"""

import torch
from torch import Tensor

from hybridspec.kernels.gdn.checks import (
    INPUT_DTYPES,
    MAX_TOKENS,
    check_commit_inputs,
    check_dtype,
    check_factor_outputs,
    check_gated_inputs,
    check_layout,
    check_pending,
    check_raw_keys,
    check_sizes,
    check_step_inputs,
)
from hybridspec.kernels.gdn.commit import launch_commit
from hybridspec.kernels.gdn.conv import causal_conv_silu
from hybridspec.kernels.gdn.reference import gdn_commit as reference_commit
from hybridspec.kernels.gdn.tuning import SHIPPED, CommitTuning, Tuning, VerifyTuning
from hybridspec.kernels.gdn.verify_recurrent import launch_verify_recurrent
from hybridspec.kernels.gdn.verify_split import launch_verify_split

__all__ = ["MAX_TOKENS", "SHIPPED", "CommitTuning", "Tuning", "VerifyTuning", "causal_conv_silu", "gdn_commit",
           "gdn_verify", "gdn_verify_gated"]

_LAUNCHERS = {"recurrent": launch_verify_recurrent, "split": launch_verify_split}


def gdn_verify(q, k, v, g, beta, state, scale, *, z_out=None, g_out=None,
               tuning: Tuning = SHIPPED) -> tuple[Tensor, Tensor, Tensor]:
    """Triton `reference.gdn_verify`: Eq. 3 and Eq. 10 for T <= 16 tokens, one launch.

    q, k [B, T, HK, dk] (L2-normalised) and v [B, T, HV, dv] in bf16 or fp32; g (log decay <= 0),
    beta [B, T, HV] bf16 or fp32; state S_0 [B, HV, dv, dk] fp32 (not modified); scale multiplies q.
    Returns o [B, T, HV, dv] in v.dtype, z [B, T, HV, dv] fp32 and g_cum [B, T, HV] fp32. When given,
    z_out [B, T, HV, dv] and g_out [B, T, HV] (fp32, any strides with a contiguous last dim, e.g.
    `buf[slot, :, :T]`) are written in place and returned as z and g_cum.
    """
    fn = "gdn_verify"
    B, T, HK, HV, dk, dv = check_step_inputs(fn, q, k, v, g, beta, state)
    check_factor_outputs(fn, z_out, g_out, (B, T, HV, dv))
    check_sizes(fn, T, dk)
    for name, x in dict(q=q, k=k, v=v, g=g, beta=beta).items():
        check_dtype(fn, name, x, INPUT_DTYPES)
    o = torch.empty(B, T, HV, dv, dtype=v.dtype, device=v.device)  # [B, T, HV, dv]
    z = z_out if z_out is not None else torch.empty(B, T, HV, dv, device=v.device)
    g_cum = g_out if g_out is not None else torch.empty(B, T, HV, device=v.device)
    check_layout(fn, dict(q=q, k=k, v=v, g=g, beta=beta, state=state, z_out=z, g_out=g_cum))

    launch = tuning.verify[T]
    _LAUNCHERS[launch.method](q, k, v, g, beta, state, scale, o, z, g_cum, launch)
    return o, z, g_cum


def gdn_verify_gated(q, k, v, a, b, A_log, dt_bias, state, scale, *, z_out=None, g_out=None, k_out=None,
                     pending=None, raw_keys=False, tuning: Tuning = SHIPPED) -> tuple[Tensor, Tensor, Tensor]:
    """Triton `reference.gdn_verify_gated`: `gdn_verify` from the raw projections in the same launch,
    the L2 norms of q and k and the gates g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
    formed inside the kernel. q, k [B, T, HK, dk] raw, v [B, T, HV, dv], a, b [B, T, HV] in bf16 or
    fp32; A_log, dt_bias [HV] any float dtype; k_out [B, T, HK, dk] (when given) receives the
    normalised k (the raw k with raw_keys, below); the rest as `gdn_verify`. raw_keys: the factors
    (z_i / |k_i|, k_i) instead, k_out receiving k as given (k's dtype, exact) and z the scaled z
    (`reference.gdn_verify_gated`).

    pending = (z [B, T', HV, dv], k [B, T', HK, dk] bf16 or fp32, g_cum [B, T', HV] fp32,
    accepted [B] long): the previous round's factors of this layer and its m, read on the device.
    Its commit (Eq. 7) is applied to `state` in place in the same launch, each program folding its
    own rows before it verifies from them, so the round costs no separate commit launch and no
    second read of the state. T' > 16 (a long prefill chunk) is committed by the reference first."""
    fn = "gdn_verify_gated"
    B, T, HK, HV, dk, dv = check_gated_inputs(fn, q, k, v, a, b, A_log, dt_bias, state, k_out)
    check_factor_outputs(fn, z_out, g_out, (B, T, HV, dv))
    check_sizes(fn, T, dk)
    for name, x in dict(q=q, k=k, v=v, a=a, b=b).items():
        check_dtype(fn, name, x, INPUT_DTYPES)
    o = torch.empty(B, T, HV, dv, dtype=v.dtype, device=v.device)
    z = z_out if z_out is not None else torch.empty(B, T, HV, dv, device=v.device)
    g_cum = g_out if g_out is not None else torch.empty(B, T, HV, device=v.device)
    tensors = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, z_out=z, g_out=g_cum)
    if pending is not None:
        check_pending(fn, state, pending)
        check_dtype(fn, "pending z", pending[0], INPUT_DTYPES)
        check_dtype(fn, "pending k", pending[1], INPUT_DTYPES)
        check_dtype(fn, "pending g_cum", pending[2], (torch.float32,))
        tensors.update(pending_z=pending[0], pending_k=pending[1], pending_g_cum=pending[2],
                       accepted=pending[3])
    check_layout(fn, tensors if k_out is None else dict(tensors, k_out=k_out))
    check_raw_keys(fn, k, k_out, raw_keys)
    if pending is not None and pending[0].shape[1] > MAX_TOKENS:
        reference_commit(state[None], *(x[None] for x in pending[:3]), pending[3])
        pending = None

    launch = tuning.verify[T]
    _LAUNCHERS[launch.method](q, k, v, a, b, state, scale, o, z, g_cum, launch, gates=(A_log, dt_bias),
                              k_out=k_out, pending=pending, raw_keys=raw_keys)
    return o, z, g_cum


def gdn_commit(states, z, k, g_cum, accepted, *, tuning: Tuning = SHIPPED) -> None:
    """Triton `reference.gdn_commit`: the accepted state of every layer by Eq. 7, one launch.

    states [L, B, HV, dv, dk] fp32 holds S_0 of every layer and is overwritten with S_m in place
    (any strides with a contiguous last dim, e.g. the runtime's cache); z [L, B, T, HV, dv] and
    k [L, B, T, HK, dk] bf16 or fp32, g_cum [L, B, T, HV] fp32 are the factors of `gdn_verify`
    (T <= 16); accepted [B] long is m per sequence (1 <= m <= T), read on the device: no host
    synchronisation (range-checked only when it already lives on the CPU).
    """
    fn = "gdn_commit"
    check_commit_inputs(states, z, k, g_cum, accepted)
    T, dk = z.shape[2], states.shape[4]
    check_sizes(fn, T, dk)
    check_dtype(fn, "z", z, INPUT_DTYPES)
    check_dtype(fn, "k", k, INPUT_DTYPES)
    check_dtype(fn, "g_cum", g_cum, (torch.float32,))
    check_layout(fn, dict(states=states, z=z, k=k, g_cum=g_cum, accepted=accepted))

    launch_commit(states, z, k, g_cum, accepted, tuning.commit[T])
