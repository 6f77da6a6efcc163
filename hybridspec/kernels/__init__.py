"""Kernels: each op has a plain-PyTorch `reference.py` and Triton kernels with the same signatures
(`gdn/`: GDN verification and the all-layer commit, DESIGN A.7; `moe/`: the MoE experts, routed and
shared, with no host read)."""
