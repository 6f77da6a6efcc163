"""Gated softmax attention of the target's full-attention layers over the static KV cache (DESIGN
B.4): `reference.py` in PyTorch (scaled_dot_product_attention with a boolean mask), `triton.py` a
split-KV kernel for any number of query tokens that reads the context length on the device, sums
its splits in a fixed order (bitwise repeatable) and applies the output gate in its combine step;
`block_attention`, the same without the gate and with every query of a block seeing the whole
context, is the drafter's."""

from hybridspec.kernels.attention.reference import block_attention, gated_attention

__all__ = ["block_attention", "gated_attention"]
