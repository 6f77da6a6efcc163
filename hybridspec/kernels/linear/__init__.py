"""Dense projections of a few tokens (decoding, verification): `reference.py` is the library's
product (`F.linear`), `triton.py` a Triton product for at most 16 rows whose grid spreads the
weight's read over N / BN programs, each row's result independent of the other rows."""
