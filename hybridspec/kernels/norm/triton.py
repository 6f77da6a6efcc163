"""Triton RMS norms: the signatures and roundings of `reference.py`, one launch per call, one
program per row (a row's sum of squares never depends on the other rows, so a token's result is
the same whatever the number of tokens in the call: batch invariance, which exactness relies on).
Rows must be contiguous in their last dimension; N ≤ 16384. `offset.py`: the offset norm and the
drafter's plain norm, the residual add fused in; `gated.py`: the GDN output norm; `checks.py`: their
argument checks."""

from hybridspec.kernels.norm.checks import MAX_N
from hybridspec.kernels.norm.gated import gated_rms_norm
from hybridspec.kernels.norm.offset import offset_rms_norm, rms_norm

__all__ = ["MAX_N", "gated_rms_norm", "offset_rms_norm", "rms_norm"]
