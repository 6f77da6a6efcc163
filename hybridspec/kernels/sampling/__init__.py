"""The point-mass verification rule with counter-based draws (DESIGN A.6, Proposition 2):
`reference.py` in plain PyTorch (the keyed uniforms, the exponential race, the target's
distribution after temperature / top-k / top-p, the rule over it); the same rule from the target's
logits on the GPU, which the resident round uses on the triton backend: `triton.py` in one launch
for temperature alone, `filtered.py` (after `candidates.py`) in two under a top-k of at most
KERNEL_TOP_K (top-p or not). Other filters (top-p alone, a larger top-k) keep the torch form's sort.
Beside them, the drafter's block statistics from its logits (argmax, its probability, the entropy):
`reference.draft_statistics`, and `statistics.py` in one launch. `blocks.py`: the store-and-combine
steps that `triton.py` and `statistics.py` share."""

KERNEL_TOP_K = 64  # the largest top-k the kernels take
BLOCK_V = 4096  # logits per (row, block) program of the kernels
