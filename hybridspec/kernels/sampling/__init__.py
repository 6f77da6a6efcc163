"""The point-mass verification rule with counter-based draws (DESIGN A.6, Proposition 2):
`reference.py` in plain PyTorch (the keyed uniforms, the exponential race, the rule over target
probabilities), `triton.py` the same rule from the target's logits in one launch, which the
resident round uses for unfiltered sampling (temperature only) on the triton backend."""
