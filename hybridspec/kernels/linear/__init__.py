"""Dense products of a few tokens (`reference.py`, `triton.py`)."""
