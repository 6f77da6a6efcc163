"""Policy tables from the store (DESIGN A.10): the measured Table 1 of an eval run (`tables.py`) and
the offline estimates replayed over a capture run's rounds (`offline.py`). Used by the eval
collector and by the report; nothing here loads a model."""
