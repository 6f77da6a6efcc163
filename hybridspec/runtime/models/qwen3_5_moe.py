"""`qwen3_5_moe_text` and `qwen3_5_moe` (text part) checkpoints: Qwen3.5 / Qwen3.6 MoE.

Names already match `HybridTarget` after removing `model.` or `model.language_model.`; the vision
tower and MTP head are skipped; per-expert weights (as `save_pretrained` writes them) go to their
rows of the fused expert tensors."""

from __future__ import annotations

from ..config import TargetConfig
from .common import Placement, expert_placement, strip_prefix

PREFIXES = ("model.language_model.", "language_model.model.", "model.")
DROP = ("mtp.", "model.visual.", "visual.", "model.mtp.")


def placements(name: str, cfg: TargetConfig) -> list[Placement]:
    name = strip_prefix(name, PREFIXES, DROP)
    if name is None:
        return []
    return [expert_placement(name, cfg.moe_intermediate_size) or Placement(name)]
