"""A request's penalties, logit bias, min_tokens and min_p on a pass's logits, row i after the
drafts before it (`runtime/penalties.py` states the rules): `reference.py` in PyTorch ops,
`triton.py` the same in two launches over (row, vocabulary block) programs."""

SCALARS = ("presence", "frequency", "repetition", "emitted", "min_tokens", "min_p_margin")  # scalars [6] fp32, in order
