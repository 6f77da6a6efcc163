"""A grammar's bitmask applied to a pass's logits (`runtime/grammar.py`): `reference.py` in PyTorch
ops, `triton.py` the same in one launch. Bit j of word i of a row allows token 32·i + j."""
