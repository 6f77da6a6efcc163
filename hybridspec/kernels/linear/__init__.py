"""The mixers' projections (DESIGN B.4): `reference.py` in plain PyTorch, `triton.py` with the same
signatures. `linear`: an input projection, one launch of 16-row tiles. `linear_add_norm`: the
out-projection with the residual add and the next RMS norm, two launches (a split-K product into
fp32 parts, then the norm's launch summing the parts)."""

from hybridspec.kernels.linear.reference import linear, linear_add_norm

__all__ = ["linear", "linear_add_norm"]
