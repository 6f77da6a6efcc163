"""Fitters: scikit-learn-style estimators over arrays read from the store (DESIGN A.9).

They never import the runtime; `export.py` writes a campaign's fits as the artifact (`artifacts/`)."""
