"""Gated softmax attention of the target's full-attention layers over the static KV cache (DESIGN
B.4): `reference.py` in PyTorch (scaled_dot_product_attention with a boolean mask), `triton.py` a
split-KV kernel for any number of query tokens that reads the context length on the device, sums
its splits in a fixed order (bitwise repeatable) and applies the output gate in its combine step."""

from hybridspec.kernels.attention.reference import gated_attention

__all__ = ["gated_attention"]
