"""The end of a speculative round in one launch (DESIGN A.8, B.9): greedy acceptance (or the
sampled rule's A and x_new as given), m = A + 1, the round's report for the host, the next anchor and
the device budget. `reference.py` is the same in PyTorch ops (about twenty small kernels);
`triton.py` the single-program kernel the resident round uses on the triton backend."""
