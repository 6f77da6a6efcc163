"""The round's length selector in one launch (DESIGN A.4–A.5, B.5): Eq. 5 (isotonic calibration,
logistic acceptance, prefix products, argmax over the candidate lengths) and Eq. 6 (the routing
correction from Stage 0's Layer-0 experts). `reference.py` is the same computation position by
position in float64; `triton.py` the kernel, which the resident round uses on the triton backend in
place of the policies' torch form (`runtime.policies.NominalPolicy.nominal_length`,
`HybridSpecPolicy.corrected_length`: about 100 small kernels)."""
