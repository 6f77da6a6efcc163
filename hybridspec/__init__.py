"""HybridSpec workbench: calibration, cost modeling and runtime for speculative decoding on
hybrid Gated DeltaNet + Mixture-of-Experts models."""

__version__ = "0.1.0"
