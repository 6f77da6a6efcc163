"""The shared core (DESIGN B.2): the DuckDB store and its schema, run metadata, prompt sets and
timing utilities. It imports nothing else of the package."""
