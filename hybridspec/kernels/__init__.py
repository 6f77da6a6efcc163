"""Kernels: each op has a plain-PyTorch `reference.py` and Triton kernels with the same signatures:
`gdn/` (GDN verification, the conv and the all-layer commit, DESIGN A.7), `moe/` (the router and the
experts, routed and shared, with no host read), `attention/` (q/k norms, RoPE and cache writes; the
split-KV attention), `linear/` (products of a few tokens), `norm/` (RMS norms), `sampling/` (the
draft's statistics, the point-mass rule) and `select/` (Eq. 5 and Eq. 6 in one launch)."""
