"""Kernels: each op has a plain-PyTorch `reference.py` and (later) a Triton kernel with the same signature."""
