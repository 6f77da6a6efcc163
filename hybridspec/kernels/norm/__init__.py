"""RMS norms of the target and the drafter (DESIGN B.4): `reference.py` in plain PyTorch, `triton.py`
one launch per call with the same signatures, so that a norm costs one kernel instead of the ten
elementwise and reduction kernels of its PyTorch form."""

from hybridspec.kernels.norm.reference import gated_rms_norm, offset_rms_norm, rms_norm

__all__ = ["gated_rms_norm", "offset_rms_norm", "rms_norm"]
