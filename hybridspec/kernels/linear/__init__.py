"""A mixer's out-projection with the residual add and the next RMS norm (DESIGN B.4): `reference.py`
in plain PyTorch, `triton.py` two launches with the same signature (a split-K product into fp32
parts, then the norm's launch summing the parts)."""

from hybridspec.kernels.linear.reference import linear_add_norm

__all__ = ["linear_add_norm"]
