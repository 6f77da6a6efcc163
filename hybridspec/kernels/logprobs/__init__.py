"""Log-probabilities of the tokens a pass's rows decided, with each row's most likely tokens
(`runtime/logprobs.py`): `reference.py` in PyTorch ops (a log-softmax over the vocabulary, a gather
and a top-k), `triton.py` the same in one launch over (row, vocabulary block) programs."""
