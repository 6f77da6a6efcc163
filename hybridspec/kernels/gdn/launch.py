"""What the GDN launchers share: launch options and the verify kernels' common arguments (the
recurrent and split kernels take the same pointers, strides and shapes)."""

import triton
from torch import Tensor

from hybridspec.kernels import pdl as pdl_launch
from hybridspec.kernels.gdn.reference import L2_EPS
from hybridspec.kernels.gdn.tuning import VerifyTuning

BLOCK_T = 16  # tokens padded to the smallest tl.dot tile


def launch_options(pdl: bool, x: Tensor) -> dict:
    """Launch with programmatic dependent launch where the tuning asks for it (`kernels/pdl.py`)."""
    return pdl_launch.options(x, enabled=pdl)


def key_block(dk: int) -> int:
    """BK: the key dimension padded to a power of two, at least one tl.dot tile."""
    return max(16, triton.next_power_of_2(dk))


def fold_args(state: Tensor, pending) -> tuple:
    """The kernels' pending-commit arguments: (z, k, g_cum, accepted, T') and their strides, or
    placeholders (T' = 0) without a pending commit."""
    if pending is None:
        return (state, state, state, state, 0, *(0,) * 8)
    z_p, k_p, g_p, accepted = pending
    return (z_p, k_p, g_p, accepted, z_p.shape[1], *z_p.stride()[:3], *k_p.stride()[:3], *g_p.stride()[:2])


def verify_arguments(q, k, v, g, beta, state, scale, o, z, g_cum, tuning: VerifyTuning, method: str, *, gates=None,
                     k_out=None, pending=None, raw_keys=False) -> tuple[tuple, tuple, dict, int]:
    """(grid, positional arguments, shape constants, T') of the verify kernel `method` (checked
    against tuning.method), on arguments that `triton.gdn_verify` / `gdn_verify_gated` have
    validated. gates = (A_log, dt_bias): q, k are raw and g, beta hold the raw a, b; pending = (z,
    k, g_cum, accepted) of the previous round (T' <= 16 tokens, 0 without), committed into state first."""
    if tuning.method != method:
        raise ValueError(f"launch_verify_{method}: tuning.method={tuning.method!r}, expected {method}")
    block_v = tuning.block_v
    B, T, HK, _ = q.shape
    HV, dv, dk = v.shape[2], v.shape[3], q.shape[3]
    if raw_keys and gates is None:
        raise ValueError("raw_keys needs the raw projections (gates): the key norms are formed in the kernel")
    grid = (B * HV, triton.cdiv(dv, block_v))
    A_log, dt_bias = gates if gates is not None else (g, g)  # unused pointers when not gated
    k_store = k_out if k_out is not None else k
    args = (q, k, v, g, beta, state, o, z, g_cum, float(scale), A_log, dt_bias, k_store,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *g.stride()[:2], *beta.stride()[:2],
            *state.stride()[:3], *o.stride()[:3], *z.stride()[:3], *g_cum.stride()[:2], *k_store.stride()[:3],
            *fold_args(state, pending))
    shape = dict(T=T, HV=HV, GROUP=HV // HK, DK=dk, DV=dv, BK=key_block(dk), BV=block_v,
                 GATED=gates is not None, WRITE_K=k_out is not None, EPS=L2_EPS, RAW_KEYS=raw_keys,
                 FOLD=pending is not None)
    return grid, args, shape, pending[0].shape[1] if pending is not None else 0
