"""Gated DeltaNet verification (Eqs. 3, 10) and accepted-state commit (Eq. 7), DESIGN A.7."""

from hybridspec.kernels.gdn.reference import gdn_commit, gdn_recurrent, gdn_verify, gdn_verify_gated

__all__ = ["gdn_commit", "gdn_recurrent", "gdn_verify", "gdn_verify_gated"]
