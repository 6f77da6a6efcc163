"""Mixture-of-Experts experts (routed + gated shared expert), DESIGN B.4: `reference.py` in plain
PyTorch, `triton.py` the GPU kernels with the same signature."""

from hybridspec.kernels.moe.checks import SharedExpert
from hybridspec.kernels.moe.reference import moe_experts, moe_experts_sync_free

__all__ = ["SharedExpert", "moe_experts", "moe_experts_sync_free"]
