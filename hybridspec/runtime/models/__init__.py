"""Checkpoint formats: one module per architecture maps its weight names onto `HybridTarget`."""
