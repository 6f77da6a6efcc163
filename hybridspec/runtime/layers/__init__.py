"""Layers shared by every supported architecture."""
