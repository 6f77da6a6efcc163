"""Weight-name helpers shared by the checkpoint formats."""

from __future__ import annotations

import re

import torch
from torch import Tensor

_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


def strip_prefixes(raw: dict[str, Tensor], prefixes: tuple[str, ...], drop: tuple[str, ...]) -> dict[str, Tensor]:
    """Remove the first matching prefix of each name; names starting with a `drop` prefix are skipped."""
    out = {}
    for name, tensor in raw.items():
        if name.startswith(drop):
            continue
        for prefix in prefixes:
            if name.startswith(prefix):
                name = name[len(prefix):]
                break
        out[name] = tensor
    return out


def fuse_experts(weights: dict[str, Tensor], num_experts: int) -> dict[str, Tensor]:
    """Per-expert `experts.{e}.{gate,up,down}_proj.weight` → fused `experts.gate_up_proj` [E, 2I, H]
    and `experts.down_proj` [E, H, I]; already-fused tensors pass through."""
    out, parts = {}, {}
    for name, tensor in weights.items():
        match = _EXPERT.match(name)
        if match is None:
            out[name] = tensor
            continue
        prefix, expert, proj = match.group(1), int(match.group(2)), match.group(3)
        parts.setdefault(prefix, {}).setdefault(proj, {})[expert] = tensor
    for prefix, projs in parts.items():
        for proj in ("gate_proj", "up_proj", "down_proj"):
            have = projs.get(proj, {})
            if sorted(have) != list(range(num_experts)):
                missing = sorted(set(range(num_experts)) - set(have))[:5]
                raise KeyError(f"{prefix}.{{e}}.{proj}.weight: experts {missing}… missing")
        stack = lambda proj: torch.stack([projs[proj][e] for e in range(num_experts)])  # noqa: E731
        out[f"{prefix}.gate_up_proj"] = torch.cat((stack("gate_proj"), stack("up_proj")), dim=1)
        out[f"{prefix}.down_proj"] = stack("down_proj")
    return out
