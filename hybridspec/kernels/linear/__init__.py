"""Dense products of a few tokens: `reference.py`, `triton.py` (the launcher and the dispatcher
`linear`), `rows.py` (the register-slice kernel)."""
