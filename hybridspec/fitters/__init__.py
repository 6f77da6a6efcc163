"""Fitters: scikit-learn-style estimators over arrays read from the store (DESIGN A.9).

They never import the runtime; the CLI hands their plain-array results to `artifacts/`."""
