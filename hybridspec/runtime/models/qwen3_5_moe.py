"""`qwen3_5_moe_text` and `qwen3_5_moe` (text part) checkpoints: Qwen3.5 / Qwen3.6 MoE.

Names already match `HybridTarget` after removing `model.` or `model.language_model.`; the vision
tower and MTP head are skipped; per-expert weights (as `save_pretrained` writes them) are fused."""

from __future__ import annotations

from torch import Tensor

from ..config import TargetConfig
from .common import fuse_experts, strip_prefixes

PREFIXES = ("model.language_model.", "language_model.model.", "model.")
DROP = ("mtp.", "model.visual.", "visual.", "model.mtp.")


def map_weights(raw: dict[str, Tensor], cfg: TargetConfig) -> dict[str, Tensor]:
    return fuse_experts(strip_prefixes(raw, PREFIXES, DROP), cfg.num_experts)
